"""Code evaluation: pass@k on HumanEval, HumanEval+, MBPP, MBPP+ and KodCode, every program in the sandbox.

One module per job: `benchmarks` (loading the formats), `evalplus_release` (EvalPlus release files scored by
evalplus's own check), `harness` (program assembly, scoring, summary), `passk` (the estimator), `cli` (the
command) and `code_eval_config` (its configuration). README_code.md describes the formats, the commands and how each benchmark is scored.
"""

from text2grad.apps.evaluation.code.benchmarks import BENCHMARKS, CodeProblem, load_problems
from text2grad.apps.evaluation.code.cli import evaluate_code, main
from text2grad.apps.evaluation.code.code_eval_config import CodeEvalConfig
from text2grad.apps.evaluation.code.harness import (
    Sample,
    SampleResult,
    build_program,
    load_samples,
    reference_samples,
    score_samples,
    summarize,
)
from text2grad.apps.evaluation.code.passk import mean_pass_at_k, pass_at_k

__all__ = [
    "BENCHMARKS",
    "CodeProblem",
    "Sample",
    "SampleResult",
    "pass_at_k",
    "mean_pass_at_k",
    "build_program",
    "load_problems",
    "load_samples",
    "reference_samples",
    "score_samples",
    "summarize",
    "CodeEvalConfig",
    "evaluate_code",
    "main",
]
