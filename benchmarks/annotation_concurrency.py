"""Annotation throughput vs concurrency against a loopback OpenAI-compatible server with fixed latency.

    python benchmarks/annotation_concurrency.py [--records 40] [--latency_s 0.2] [--concurrency 1 4 16]

Each request to the scripted server (tests/fake_openai.py, run as its own process on 127.0.0.1, like a
remote API) takes ``latency_s`` seconds; everything on the client side (the openai client, retries, span
validation, crash-safe appends, the report) is the real pipeline. Prints records per second for each
concurrency and the speedup over concurrency 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from annotation.annotation_config import AnnotationConfig  # noqa: E402
from annotation.runner import run_annotation  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--latency_s", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        url_file = Path(tmp) / "url"
        server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_openai.py"), "--port_file", str(url_file),
                                   "--delay_s", str(args.latency_s)])
        try:
            rows = _measure(args, Path(tmp), url_file)
        finally:
            server.terminate()
            server.wait(timeout=10)
    base = rows[0][2]
    print(f"records={args.records} latency={args.latency_s * 1000:.0f} ms per request")
    print(f"{'concurrency':>11} {'seconds':>8} {'records/s':>10} {'speedup':>8}")
    for c, elapsed, rate in rows:
        print(f"{c:>11} {elapsed:>8.2f} {rate:>10.2f} {rate / base:>7.1f}x")
    return 0


def _measure(args: argparse.Namespace, tmp: Path, url_file: Path) -> list[tuple[int, float, float]]:
    deadline = time.monotonic() + 30
    while not (url_file.exists() and url_file.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError("the scripted server did not start")
        time.sleep(0.05)
    base_url = url_file.read_text().strip()
    data = tmp / "in.jsonl"
    with data.open("w") as fh:
        for i in range(args.records):
            response = f"Answer {i}: water it sparingly.\nSoak the soil, then let it dry.\nDone {i}."
            fh.write(json.dumps({"id": f"r{i}", "prompt": f"Question {i}?", "response": response}) + "\n")
    rows = []
    for c in args.concurrency:
        # An unset key variable: the loopback server gets a placeholder key, never a real one.
        cfg = AnnotationConfig(input=str(data), output=str(tmp / f"out_c{c}.jsonl"), base_url=base_url,
                               api_key_env="BENCH_NO_KEY", concurrency=c, progress_bar=False)
        start = time.perf_counter()
        report = run_annotation(cfg)
        elapsed = time.perf_counter() - start
        assert report.done == args.records and report.failed == 0, report.summary()
        rows.append((c, elapsed, args.records / elapsed))
    return rows


if __name__ == "__main__":
    sys.exit(main())
