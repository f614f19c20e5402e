"""Wall time of the embedded default, per stage, on a fresh cache, with this machine's speed next to it.

    python benchmarks/quickstart_time.py                         # the default preset, twice
    python benchmarks/quickstart_time.py --reference 5b46bc2     # an older commit first, then this tree twice
    python benchmarks/quickstart_time.py --runs 1 --preset ci    # a quick check of the script itself

Each run is the quickstart in its own process with its own empty ``TEXT2GRAD_CACHE`` (nothing is reused between
runs, so every run pays for SFT and the reward model). The quickstart itself records the seconds of every stage and a fixed fp32 matmul benchmark of the machine
(``results.json``: ``stage_seconds``, ``machine_speed``); this script adds the process's wall time and peak RSS
(``os.wait4``), and prints one Markdown table for benchmarks/README.md, also written to
``<output_dir>/quickstart_time.json``. ``--output_json FILE`` writes the runs with machine, date, command and load
averages to FILE and each run's ``results.json`` next to it (``<FILE stem>-run-<i>-results.json``): the result files
``benchmarks/results_tables.py`` reads.

``--reference REV`` first runs the quickstart of git revision ``REV`` (a detached ``git worktree``, same venv, same
environment) the same way, so old and new code are timed side by side in one invocation and the table gives their
ratio. Runs use ``python -m text2grad.apps.quickstart`` with the environment ``env.sh`` exports (offline hub,
``OMP_WAIT_POLICY``), which is what ``bash scripts/quickstart.sh`` runs after its up-to-date check.

Compare figures from two machines through the ``GFLOP/s`` column: a machine with half the matmul speed should take
about twice as long. Run it on an idle machine (the load average at the start of each run is in the table): beside
another busy process, 2 torch threads on 2 cores slow down far more than 2x with OpenMP's spinning wait policy,
which is why env.sh sets ``OMP_WAIT_POLICY=PASSIVE``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.result_file import run_context, write_result  # noqa: E402
STAGE_COLUMNS = (("policy (tokenizer, tiny Llama, SFT)", "SFT"), ("annotation", "annotation"),
                 ("reward model", "reward model"), ("policy optimization", "PPO"), ("evaluation", "eval"),
                 ("report", "report"))
POLICIES = (("sft", "SFT"), ("nl_gradient", "Text2Grad"), ("scalar", "scalar PPO"))


def time_one_run(run_dir: Path, preset: str, extra: Sequence[str], code: Path = ROOT) -> dict[str, Any]:
    """One quickstart of the code in ``code`` in a fresh process and cache; its wall time, peak RSS and results.json."""
    out, cache = run_dir / "quickstart", run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TEXT2GRAD_CACHE": str(cache), "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    cmd = [sys.executable, "-m", "text2grad.apps.quickstart", "--config", "configs/quickstart/quickstart.yaml",
           "--preset", preset, "--output_dir", str(out), *extra]
    print(f"$ (cd {code} && TEXT2GRAD_CACHE={cache} " + " ".join(cmd) + ")", flush=True)
    with (run_dir / "quickstart.log").open("w") as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the quickstart failed (exit {os.waitstatus_to_exitcode(status)}); see {run_dir / 'quickstart.log'}")
    summary = json.loads((out / "results.json").read_text())
    return {
        "code": str(code),
        "wall_seconds": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),  # Linux reports KiB
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "stage_seconds": {k: round(v, 1) for k, v in summary["stage_seconds"].items()},
        "machine_speed": summary.get("machine_speed") or {},  # older code did not measure it
        "fact_score": {name: summary["results"][name]["fact_score"] for name, _ in POLICIES if name in summary["results"]},
        "reward_model_eval": summary.get("reward_model_eval", {}),
    }


def reference_worktree(rev: str, where: Path) -> Path:
    """A detached checkout of ``rev`` (removed again by :func:`remove_worktree`)."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True, capture_output=True)
    return where


def remove_worktree(where: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False, capture_output=True)


def markdown(runs: list[dict[str, Any]], preset: str, labels: Sequence[str]) -> str:
    stage_head = " | ".join(f"{label} s" for _, label in STAGE_COLUMNS)
    policy_head = " | ".join(label for _, label in POLICIES)
    lines = [f"| run | wall s | CPU s | peak RSS MB | GFLOP/s (load) | {stage_head} | fact score: {policy_head} |",
             "|---" * (5 + len(STAGE_COLUMNS) + len(POLICIES)) + "|"]
    for label, r in zip(labels, runs):
        speed = r["machine_speed"]
        measured = f"{speed['matmul_gflops']:.1f} ({speed['load_average_1min']})" if speed else "-"
        stages = " | ".join(f"{r['stage_seconds'].get(key, 0.0):.0f}" for key, _ in STAGE_COLUMNS)
        scores = " | ".join(f"{r['fact_score'].get(name, float('nan')):.3f}" for name, _ in POLICIES)
        lines.append(f"| {label} | {r['wall_seconds']:.0f} | {r['cpu_seconds']:.0f} | {r['peak_rss_mb']} | {measured} | "
                     f"{stages} | {scores} |")
    if labels[0].startswith("reference"):
        new = [r["wall_seconds"] for label, r in zip(labels, runs) if not label.startswith("reference")]
        lines.append(f"\nreference / this tree wall time: {runs[0]['wall_seconds'] / (sum(new) / len(new)):.2f}x")
    speed = next((r["machine_speed"] for r in runs if r["machine_speed"]), {})
    lines.append(f"\npreset {preset}; {speed.get('cpu_count')} cores ({speed.get('cpu')}), {speed.get('torch_threads')} torch "
                 f"threads; OMP_WAIT_POLICY {speed.get('omp_wait_policy')}; python {platform.python_version()}; GFLOP/s: "
                 f"{speed.get('matmul_size')}x{speed.get('matmul_size')} fp32 matmul measured by the quickstart at its start "
                 "(median of 7).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="how many fresh-cache runs, one after the other")
    parser.add_argument("--preset", default="default", help="quickstart preset")
    parser.add_argument("--output_dir", default="runs/bench_quickstart_time", help="one run-<i>/ folder per run")
    parser.add_argument("--reference", default=None, help="a git revision whose quickstart is timed first, the same way")
    parser.add_argument("--output_json", default=None,
                        help="also write the runs with machine, date, command and load averages here (a result file "
                             "for benchmarks/results/, read by benchmarks/results_tables.py)")
    parser.add_argument("extra", nargs="*", help="more quickstart flags, after --")
    args = parser.parse_args(argv)
    context = run_context(list(argv) if argv is not None else None)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    root = Path(args.output_dir).resolve()
    if root.exists() and any(root.iterdir()):
        parser.error(f"{root} is not empty: a fresh cache needs a fresh folder; pass another --output_dir")
    runs, labels = [], []
    if args.reference:
        code = reference_worktree(args.reference, root / "reference-code")
        try:
            runs.append(time_one_run(root / "reference", args.preset, args.extra, code=code))
        finally:
            remove_worktree(code)
        labels.append(f"reference {args.reference}")
        print(f"reference {args.reference}: {runs[-1]['wall_seconds']:.0f} s wall", flush=True)
    for i in range(1, args.runs + 1):
        runs.append(time_one_run(root / f"run-{i}", args.preset, args.extra))
        labels.append(f"this tree, run {i}")
        print(f"run {i}: {runs[-1]['wall_seconds']:.0f} s wall, stages {runs[-1]['stage_seconds']}", flush=True)
    table = markdown(runs, args.preset, labels)
    (root / "quickstart_time.json").write_text(json.dumps({"preset": args.preset, "labels": labels, "runs": runs}, indent=1))
    print("\n" + table)
    if args.output_json:
        written = write_result(args.output_json, context, {"preset": args.preset, "labels": labels, "runs": runs})
        for i, label in enumerate(labels):  # each run's own results.json (curves, early stopping), next to it
            run_dir = root / ("reference" if label.startswith("reference") else f"run-{label.rsplit(' ', 1)[1]}")
            target = written.with_name(f"{written.stem}-{run_dir.name}-results.json")
            target.write_text((run_dir / "quickstart" / "results.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
