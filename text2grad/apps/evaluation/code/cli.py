"""``python -m text2grad.apps.evaluation.code`` / ``text2grad eval-code``: generate with a policy (or read samples,
or take the references), score in the sandbox, write the reports. Examples are in README_code.md."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from text2grad.apps.evaluation.code.benchmarks import CodeProblem, load_problems
from text2grad.apps.evaluation.code.code_eval_config import CodeEvalConfig
from text2grad.apps.evaluation.code.harness import Sample, load_samples, reference_samples, score_samples, summarize
from text2grad.apps.evaluation.common import load_generator, markdown_table, run_cli, write_report
from text2grad.core.config import save_config
from text2grad.core.data import write_jsonl
from text2grad.core.generation import apply_chat_template
from text2grad.core.sandbox import isolation

__all__ = ["evaluate_code", "main", "COMPLETION_STOPS"]

# Stop sequences that end a HumanEval-style function body (the completion continues an indented body).
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


# Instruct/chat models (use_chat_template): ask for the whole function in one fenced block.
_DEFAULT_CHAT_TEMPLATES = {
    "humaneval": "Complete the following Python function. Answer with the whole function in a single ```python code block.\n\n```python\n{prompt}```",
    "humaneval_plus": "Complete the following Python function. Answer with the whole function in a single ```python code block.\n\n```python\n{prompt}```",
    "mbpp": "{prompt}\nAnswer with the Python code in a single ```python code block.",
    "mbpp_plus": "{prompt}\nWrite the Python function. Answer with the code in a single ```python code block.",
    "kodcode": "{prompt}\n\nAnswer with a Python solution in a single ```python code block.",
}

# Base models: HumanEval is a continuation of the prompt; the others open a code fence for the model to fill.
_DEFAULT_TEMPLATES = {
    "humaneval": "{prompt}",
    "humaneval_plus": "{prompt}",
    "mbpp": "You are an expert Python programmer, and here is your task: {prompt}\n```python\n",
    "mbpp_plus": "Complete the following task in Python:\n{prompt}\n```python\n",
    "kodcode": "{prompt}\n\nWrite a Python solution. Answer with the code only.\n```python\n",
}


def _generate_samples(cfg: CodeEvalConfig, problems: Sequence[CodeProblem]) -> dict[str, list[Sample]]:
    generator = load_generator(cfg)
    tokenizer = generator.tokenizer
    defaults = _DEFAULT_CHAT_TEMPLATES if cfg.use_chat_template else _DEFAULT_TEMPLATES
    template = cfg.prompt_template or defaults[cfg.benchmark]
    prompts = [template.replace("{prompt}", p.prompt) for p in problems]
    if cfg.use_chat_template:
        prompts = [apply_chat_template(tokenizer, p, cfg.system_prompt) for p in prompts]
    if cfg.stop_strings is not None:
        stops = list(cfg.stop_strings)
    elif cfg.use_chat_template:
        stops = []  # chat answers may open with prose and a fence; EOS ends them, extract_code finds the code
    elif cfg.benchmark in ("humaneval", "humaneval_plus"):
        stops = list(COMPLETION_STOPS)
    else:
        stops = ["\n```"]  # the default template opened the fence; its closing ends the code
    # every prompt n times in a row; greedy for n == 1 (pass@1 of the policy's mode), sampling otherwise
    expanded = [p for p in prompts for _ in range(cfg.n)]
    gens = generator.generate(
        expanded, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, do_sample=cfg.n > 1,
        temperature=cfg.temperature, top_p=cfg.top_p, max_prompt_length=cfg.max_prompt_length,
        stop_strings=stops or None, add_special_tokens=not cfg.use_chat_template, seed=cfg.seed,
        progress_bar=cfg.progress_bar,
    )
    samples: dict[str, list[Sample]] = {p.task_id: [] for p in problems}
    for j, g in enumerate(gens):
        problem = problems[j // cfg.n]
        text = g.text
        for stop in stops:  # the stop string itself is not part of the code
            if text.endswith(stop):
                text = text[: -len(stop)]
                break
        samples[problem.task_id].append(Sample(problem.task_id, completion=text))
    return samples


def evaluate_code(cfg: CodeEvalConfig) -> dict[str, Any]:
    """Load problems, get samples (generate / file / references), score them, write the reports."""
    name = cfg.name or cfg.benchmark
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_dir / f"{name}_config.yaml")
    problems = load_problems(cfg.benchmark, cfg.dataset_path, cfg.limit, cfg.task_ids or None)
    if cfg.score_references:
        samples = {s.task_id: [s] for s in reference_samples(problems)}
        system = f"{cfg.benchmark} reference solutions"
    elif cfg.samples_file:
        samples = load_samples(cfg.samples_file, problems)
        system = cfg.samples_file
    else:
        samples = _generate_samples(cfg, problems)
        system = cfg.model + (f" + {cfg.adapter}" if cfg.adapter else "")
        write_jsonl(out_dir / f"{name}_completions.jsonl",
                    [{"task_id": t, "completion": s.completion} for t, ss in samples.items() for s in ss])

    iso = isolation()
    t0 = time.monotonic()
    results = score_samples(
        problems, samples, workers=cfg.workers, timeout_s=cfg.timeout_s, per_test_timeout_s=cfg.per_test_timeout_s,
        memory_mb=cfg.memory_mb, progress_bar=cfg.progress_bar,
    )
    elapsed = time.monotonic() - t0
    scores, problem_rows = summarize(problems, results, cfg.k)
    verdicts = Counter(r.verdict for r in results)
    empty = sum(r.error_type == "EmptyCompletion" for r in results)
    unparseable = sum(r.error_type in ("SyntaxError", "IndentationError", "TabError") for r in results)
    write_jsonl(out_dir / f"{name}_samples.jsonl", [
        {"task_id": r.task_id, "sample": r.index, "verdict": r.verdict, "passed": r.passed, "error_type": r.error_type,
         "message": r.message, "tests_passed": r.tests_passed, "tests_total": r.tests_total,
         "duration_s": round(r.duration_s, 3), "program": r.program, "tests": r.test_outcomes,
         **({"base_passed": r.base_passed} if r.base_passed is not None else {})}
        for r in results
    ])
    summary_rows = [{"metric": f"{k} ({cfg.benchmark}, {len(problems)} problems, n={min(len(s) for s in samples.values())})", "value": v}
                    for k, v in scores.items()]
    summary_rows += [{"metric": f"samples {v}", "value": c} for v, c in sorted(verdicts.items())]
    notes = [
        "pass@k: unbiased estimator 1 - C(n-c,k)/C(n,k) per problem, averaged over problems.",
        f"Scoring: {_scoring(cfg.benchmark, problems)}",
        f"Empty completions ({empty}) and completions that do not parse ({unparseable}) count as failures.",
        f"Sandbox: {', '.join(['namespaces (no network)'] if iso.namespaces else ['NO network isolation'])}"
        f"{', unprivileged uid' if iso.drop_uid else ''}; {_limits(cfg, problems)}, {cfg.memory_mb} MiB; {cfg.workers} workers, "
        f"{len(results) / max(elapsed, 1e-9):.1f} programs/s.",
    ]
    report = {
        "system": system,
        "benchmark": cfg.benchmark,
        "data": cfg.dataset_path,
        "problems": len(problems),
        "samples": len(results),
        **scores,
        "verdicts": dict(verdicts),
        "empty_completions": empty,
        "syntax_errors": unparseable,
        "programs_per_s": len(results) / max(elapsed, 1e-9),
        "per_problem": problem_rows,
        "scoring": _scoring(cfg.benchmark, problems),
        "notes": notes,
    }
    json_path, md_path = write_report(out_dir, name, report, summary_rows, title=f"Code evaluation: {system}")
    problems_md = out_dir / f"{name}_problems.md"
    problems_md.write_text(f"# Per-problem verdicts: {system}\n\n" + markdown_table(problem_rows), encoding="utf-8")
    report["report_json"], report["report_md"], report["problems_md"] = str(json_path), str(md_path), str(problems_md)
    return report


def _limits(cfg: CodeEvalConfig, problems: Sequence[CodeProblem]) -> str:
    if problems[0].evalplus is not None:
        return (f"each input max(1 s, 4 x the reference time) (evalplus), the program at least {cfg.timeout_s} s and "
                "as long as those limits can add up to")
    return f"timeout {cfg.timeout_s} s per program, {cfg.per_test_timeout_s} s per test"


def _scoring(benchmark: str, problems: Sequence[CodeProblem]) -> str:
    """One sentence saying how this run scored a sample (it differs between the formats of one benchmark)."""
    if problems[0].evalplus is not None:
        return ("EvalPlus release file, differential testing with evalplus's own check (untrusted_check) in the "
                "sandbox: outputs vs the canonical solution's on every base and plus input (atol for floats, "
                "evalplus's per-task input handling and oracles); pass@k = base and plus inputs all pass "
                "(HumanEval+/MBPP+), base_pass@k = base inputs only.")
    return {
        "humaneval": "HumanEval's check(candidate) (the base tests).",
        "humaneval_plus": "the HF original-format `test` (base+plus checks written as code, expected outputs built in).",
        "mbpp_plus": "the HF original-format `test` (base+plus checks written as code, expected outputs built in).",
        "mbpp": "the task's own asserts (test_list); the original MBPP set (974 tasks, or the 427 of sanitized-mbpp.json), "
                "not EvalPlus's 378 (for those, base_pass@k of mbpp_plus).",
        "kodcode": "the record's pytest-style unit tests.",
    }[benchmark]


def main(argv: list[str] | None = None) -> int:
    return run_cli(CodeEvalConfig, evaluate_code, argv)

