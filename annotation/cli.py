"""``python -m text2grad.annotate`` / ``text2grad annotate``: phase 1, dual-feedback annotation.

Examples::

    # GPT-4o with the chain-of-thought prompt (key from $OPENAI_API_KEY)
    python -m text2grad.annotate --config configs/ultrafeedback/annotation.yaml \\
        --input data/uf.jsonl --output runs/uf/annotations.jsonl

    # any OpenAI-compatible server (vLLM, a local server), no-CoT prompt, 32 requests at a time
    python -m text2grad.annotate --config configs/slf5k/annotation.yaml --base_url http://localhost:8000/v1 \\
        --model meta-llama/Llama-3.1-70B-Instruct --cot false --concurrency 32 --input ... --output ...

    # unit tests in the sandbox instead of an LLM (no API, no cost)
    python -m text2grad.annotate --config configs/kodcode/annotation.yaml --critic code_tests --input ... --output ...

Rerunning the same command resumes. Exit codes: 0 done (or stopped by a budget; the report says so),
1 the API refused us (bad key, model or URL), 2 bad configuration or input, 130 interrupted.
"""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from annotation.config import AnnotationConfig
from annotation.runner import run_annotation
from text2grad.core.config import parse_config
from text2grad.core.data import DataError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(AnnotationConfig, argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = run_annotation(cfg)
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    print(f"report: {cfg.report_path}")
    if report.fatal_error:
        return 1
    if report.interrupted:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
