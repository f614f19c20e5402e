"""Evaluation suites, one entry point per benchmark family of the paper.

- ``python -m text2grad.apps.evaluation.summarization``: SLF5K-style ROUGE / BLEU / BERTScore / perplexity / judged win rate.
- ``python -m text2grad.apps.evaluation.code``: HumanEval / MBPP(+) pass@k in the sandbox.
- ``python -m text2grad.apps.evaluation.qa``: ARC-Challenge log-likelihood accuracy, AlpacaEval / MT-Bench style judging.

Shared helpers (loading a policy, continuation log-probs, writing reports) live in
`text2grad.apps.evaluation.common`. Importing this package imports nothing heavy.
"""

from __future__ import annotations

from text2grad.core.critics import load_object

__all__ = ["load_policy", "write_report", "continuation_logprobs", "markdown_table"]


def __getattr__(name: str):
    # Lazy re-exports: `from text2grad.apps.evaluation import load_policy` without importing torch at package import.
    if name in __all__:
        return load_object(f"text2grad.apps.evaluation.common:{name}")
    raise AttributeError(f"module 'text2grad.apps.evaluation' has no attribute {name!r}")
