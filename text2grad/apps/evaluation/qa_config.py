"""The configuration of `text2grad eval-qa` (`QAEvalConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from text2grad.core.config import ConfigError, config_field
from text2grad.core.generation_options import GENERATION_BACKEND_HELP, VLLM_KWARGS_HELP, GenerationBackend

__all__ = ["QAEvalConfig"]


@dataclass
class QAEvalConfig:
    """Evaluate a policy on ARC-Challenge (log-likelihood) or AlpacaEval / MT-Bench style judged QA."""

    task: Literal["arc", "alpaca_eval", "mt_bench"] = config_field("arc", "Which evaluation to run.")
    dataset_path: str = config_field("", "Data: .jsonl/.json file, saved dataset directory, or hub id.")
    dataset_config: str | None = config_field(None, "Hub dataset config name, e.g. ARC-Challenge.")
    dataset_split: str | None = config_field(None, "Split for hub ids / dataset dicts (ARC: 'test').")
    field_map: dict = config_field({}, "Rename fields, {our_name: their_name}.")
    limit: int | None = config_field(None, "Evaluate only the first N records.")

    model: str | None = config_field(None, "Policy: hub id, local dir, or adapter-only dir.")
    adapter: str | None = config_field(None, "LoRA adapter directory applied on top of --model.")
    dtype: str = config_field("auto", "auto | bf16 | fp16 | fp32.")
    device: str | None = config_field(None, "cpu | cuda | cuda:N (default: GPU if visible).")
    generation_backend: GenerationBackend = config_field("hf", GENERATION_BACKEND_HELP)
    vllm_kwargs: dict[str, Any] = config_field({}, VLLM_KWARGS_HELP)
    batch_size: int = config_field(8, "Batch size for scoring and generation.")

    arc_prompt_template: str = config_field(
        "Question: {question}\nAnswer:",
        "ARC context; {question} is the question stem.",
    )
    choice_prefix: str = config_field(" ", "Put before each ARC choice (the separator after 'Answer:').")
    max_length: int = config_field(2048, "ARC: context+choice tokens beyond this are cut (context from the left).")

    use_chat_template: bool = config_field(True, "alpaca_eval/mt_bench: wrap turns in the tokenizer's chat template.")
    system_prompt: str | None = config_field(None, "System message for generation.")
    max_new_tokens: int = config_field(512, "Answer length limit (tokens).")
    max_prompt_length: int = config_field(2048, "Prompts longer than this are cut from the left.")
    do_sample: bool = config_field(False, "Sample instead of greedy decoding.")
    temperature: float = config_field(0.7, "Sampling temperature (do_sample only).")
    top_p: float = config_field(1.0, "Nucleus sampling (do_sample only).")
    seed: int = config_field(0, "Seed for sampling.")

    instruction_field: str = config_field("instruction", "alpaca_eval: field holding the instruction.")
    baseline_field: str = config_field("output", "alpaca_eval: field holding the baseline's output.")
    baseline_predictions: str | None = config_field(None, "alpaca_eval: the baseline's outputs from a file instead (JSONL/JSON, matched by id or instruction).")
    baseline_name: str = config_field("baseline", "Name of the baseline system in reports.")
    predictions_file: str | None = config_field(
        None,
        "Judge these outputs instead of generating: JSONL/JSON {id or instruction, prediction} (mt_bench: a list of answers per turn).",
    )
    prediction_field: str = config_field("prediction", "Field of predictions files holding the output(s).")

    judge_model: str | None = config_field(None, "Judge model (required for alpaca_eval and mt_bench).")
    judge_base_url: str | None = config_field(None, "OpenAI-compatible endpoint of the judge (default: OpenAI).")
    judge_api_key_env: str = config_field("OPENAI_API_KEY", "Environment variable holding the judge's API key.")
    judge_prompt: str | None = config_field(None, "Template name or file (default: the task's packaged template).")
    judge_concurrency: int = config_field(8, "Judge requests in flight at once.")
    judge_max_retries: int = config_field(5, "Retries per judge request on 429/5xx/timeouts.")
    judge_max_tokens: int = config_field(1024, "Judge answer length limit.")
    judge_seed: int = config_field(0, "Seed of the per-item A/B order.")
    length_controlled: bool = config_field(True, "alpaca_eval: try alpaca-eval's length-controlled win rate.")

    output_dir: str = config_field("runs/eval/qa", "Where reports and per-item outputs are written.")
    name: str | None = config_field(None, "Report file stem (default: the task name).")
    progress_bar: bool = config_field(True, "Show progress bars.")

    def __post_init__(self) -> None:
        if not self.dataset_path:
            raise ConfigError("--dataset_path is required: a .jsonl/.json file, a saved dataset directory or a hub id")
        if self.task == "arc" and self.model is None:
            raise ConfigError("--task arc scores answer choices with the policy: pass --model")
        if self.task != "arc":
            if self.model is None and self.predictions_file is None:
                raise ConfigError(f"--task {self.task} needs --model (to generate answers) or --predictions_file")
            if not self.judge_model:
                raise ConfigError(f"--task {self.task} is judged: pass --judge_model (and --judge_base_url for a local server)")
