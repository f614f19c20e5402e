"""Code evaluation: pass@k on HumanEval, HumanEval+, MBPP, MBPP+ and KodCode, every program in the sandbox.

One module per job: `benchmarks` (loading the formats), `evalplus_release` (EvalPlus release files scored by
evalplus's own check), `harness` (program assembly, scoring, summary), `passk` (the estimator), `cli` (the
command) and `code_eval_config` (its configuration). Names are loaded on first use
(`text2grad.core.critics.lazy_exports`): the configuration alone, as ``text2grad eval-code --help`` reads it, loads no
ML library. README_code.md describes the formats, the commands and how each benchmark is scored.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_MODULES = {
    "benchmarks": ["BENCHMARKS", "CodeProblem", "load_problems"],
    "cli": ["evaluate_code", "main"],
    "code_eval_config": ["CodeEvalConfig"],
    "harness": ["Sample", "SampleResult", "build_program", "load_samples", "reference_samples", "score_samples", "summarize"],
    "passk": ["mean_pass_at_k", "pass_at_k"],
}
_EXPORTS = {name: f"text2grad.apps.evaluation.code.{module}" for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
