"""``python -m text2grad.annotate`` / ``text2grad annotate``: phase 1, dual-feedback annotation.

Examples::

    # GPT-4o with the chain-of-thought prompt (key from $OPENAI_API_KEY)
    python -m text2grad.annotate --config configs/ultrafeedback/annotation.yaml \\
        --dataset_path data/uf.jsonl --output runs/uf/annotations.jsonl

    # any OpenAI-compatible server (vLLM, a local server), no-CoT prompt, 32 requests at a time
    python -m text2grad.annotate --config configs/slf5k/annotation.yaml --base_url http://localhost:8000/v1 \\
        --model meta-llama/Llama-3.1-70B-Instruct --cot false --concurrency 32 --dataset_path ... --output ...

    # unit tests in the sandbox instead of an LLM (no API, no cost)
    python -m text2grad.annotate --config configs/kodcode/annotation.yaml --critic code_tests --dataset_path ... --output ...

Rerunning the same command resumes. Exit codes: 0 done (or stopped by a budget; the report says so),
1 the API refused us or could not be reached (bad key, model or URL; the message names it), 2 bad
configuration or input (an empty input included), 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import Sequence

from annotation.annotation_config import AnnotationConfig
from annotation.runner import run_annotation
from text2grad.core.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, print_error, run_cli
from text2grad.core.config import ConfigError

__all__ = ["main"]


def annotate(cfg: AnnotationConfig) -> int:
    try:
        report = run_annotation(cfg)
    except ValueError as exc:  # a bad path or setting found before any request (DataError is handled by run_cli)
        raise ConfigError(str(exc)) from None
    print(report.summary())
    print(f"report: {cfg.report_path}")
    if report.fatal_error:
        print_error(f"stopped: {report.fatal_error}")
        return EXIT_FAILED
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(AnnotationConfig, annotate, argv)


if __name__ == "__main__":
    sys.exit(main())
