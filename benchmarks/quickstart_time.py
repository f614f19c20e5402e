"""Wall time of the embedded default, per stage, on a fresh cache, with this machine's speed next to it.

    python benchmarks/quickstart_time.py                         # the default preset, twice
    python benchmarks/quickstart_time.py --runs 1 --preset ci    # a quick check of the script itself

Each run is exactly what a user types, ``bash scripts/quickstart.sh --output_dir <dir>``, in its own process with
its own empty ``TEXT2GRAD_CACHE`` (nothing is reused between runs, so both pay for SFT and the reward model). The
quickstart itself records the seconds of every stage and a fixed fp32 matmul benchmark of the machine
(``results.json``: ``stage_seconds``, ``machine_speed``); this script adds the process's wall time and peak RSS
(``os.wait4``), and prints one Markdown table for benchmarks/README.md, also written to
``<output_dir>/quickstart_time.json``.

Compare figures from two machines through the ``GFLOP/s`` column: a machine with half the matmul speed should take
about twice as long. Run it on an idle machine (the load average at the start of each run is in the table): two
CPU-bound jobs on 2 cores do not each take twice as long, they can take 4x (OpenMP threads wait for each other).
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
STAGE_COLUMNS = (("policy (tokenizer, tiny Llama, SFT)", "SFT"), ("annotation", "annotation"),
                 ("reward model", "reward model"), ("policy optimization", "PPO"), ("evaluation", "eval"),
                 ("report", "report"))
POLICIES = (("sft", "SFT"), ("nl_gradient", "Text2Grad"), ("scalar", "scalar PPO"))


def time_one_run(run_dir: Path, preset: str, extra: Sequence[str]) -> dict[str, Any]:
    """One ``scripts/quickstart.sh`` run in a fresh process and cache; its wall time, peak RSS and results.json."""
    out, cache = run_dir / "quickstart", run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TEXT2GRAD_CACHE": str(cache)}
    cmd = ["bash", str(ROOT / "scripts" / "quickstart.sh"), "--preset", preset, "--output_dir", str(out), *extra]
    print("$ TEXT2GRAD_CACHE=" + str(cache) + " " + " ".join(cmd), flush=True)
    with (run_dir / "quickstart.log").open("w") as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the quickstart failed (exit {os.waitstatus_to_exitcode(status)}); see {run_dir / 'quickstart.log'}")
    summary = json.loads((out / "results.json").read_text())
    return {
        "wall_seconds": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),  # Linux reports KiB
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "stage_seconds": {k: round(v, 1) for k, v in summary["stage_seconds"].items()},
        "machine_speed": summary["machine_speed"],
        "fact_score": {name: summary["results"][name]["fact_score"] for name, _ in POLICIES if name in summary["results"]},
        "reward_model_eval": summary.get("reward_model_eval", {}),
    }


def markdown(runs: list[dict[str, Any]], preset: str) -> str:
    stage_head = " | ".join(f"{label} s" for _, label in STAGE_COLUMNS)
    policy_head = " | ".join(label for _, label in POLICIES)
    lines = [f"| run | wall s | CPU s | peak RSS MB | GFLOP/s (load) | {stage_head} | fact score: {policy_head} |",
             "|---" * (5 + len(STAGE_COLUMNS) + len(POLICIES)) + "|"]
    for i, r in enumerate(runs, 1):
        speed = r["machine_speed"]
        stages = " | ".join(f"{r['stage_seconds'].get(key, 0.0):.0f}" for key, _ in STAGE_COLUMNS)
        scores = " | ".join(f"{r['fact_score'].get(name, float('nan')):.3f}" for name, _ in POLICIES)
        lines.append(f"| {i} | {r['wall_seconds']:.0f} | {r['cpu_seconds']:.0f} | {r['peak_rss_mb']} | "
                     f"{speed['matmul_gflops']:.1f} ({speed['load_average_1min']}) | {stages} | {scores} |")
    speed = runs[0]["machine_speed"]
    lines.append(f"\npreset {preset}; {speed['cpu_count']} cores ({speed['cpu']}), {speed['torch_threads']} torch threads; "
                 f"OMP_WAIT_POLICY {speed.get('omp_wait_policy')}; python {platform.python_version()}; GFLOP/s: {speed['matmul_size']}x{speed['matmul_size']} fp32 "
                 "matmul measured by the quickstart at its start (median of 7).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="how many fresh-cache runs, one after the other")
    parser.add_argument("--preset", default="default", help="quickstart preset")
    parser.add_argument("--output_dir", default="runs/bench_quickstart_time", help="one run-<i>/ folder per run")
    parser.add_argument("extra", nargs="*", help="more quickstart flags, after --")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    root = Path(args.output_dir)
    if root.exists() and any(root.iterdir()):
        parser.error(f"{root} is not empty: a fresh cache needs a fresh folder; pass another --output_dir")
    runs = []
    for i in range(1, args.runs + 1):
        runs.append(time_one_run(root / f"run-{i}", args.preset, args.extra))
        print(f"run {i}: {runs[-1]['wall_seconds']:.0f} s wall, stages {runs[-1]['stage_seconds']}", flush=True)
    table = markdown(runs, args.preset)
    (root / "quickstart_time.json").write_text(json.dumps({"preset": args.preset, "runs": runs}, indent=1))
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
