"""Evaluation suites, one entry point per benchmark family of the paper.

- ``python -m text2grad.apps.evaluation.summarization``: SLF5K-style ROUGE / BLEU / BERTScore / perplexity / judged win rate.
- ``python -m text2grad.apps.evaluation.code``: HumanEval / MBPP(+) pass@k in the sandbox.
- ``python -m text2grad.apps.evaluation.qa``: ARC-Challenge log-likelihood accuracy, AlpacaEval / MT-Bench style judging.

Shared helpers (loading a policy, continuation log-probs, writing reports) live in
`text2grad.apps.evaluation.common`. Importing this package imports nothing heavy.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_EXPORTS = dict.fromkeys(["load_policy", "write_report", "continuation_logprobs", "markdown_table"],
                         "text2grad.apps.evaluation.common")

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
