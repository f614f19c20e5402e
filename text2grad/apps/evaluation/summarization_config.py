"""The configuration of `text2grad eval-summarization` (`SummarizationEvalConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from text2grad.core.config import ConfigError, config_field
from text2grad.core.generation_options import GENERATION_BACKEND_HELP, VLLM_KWARGS_HELP, GenerationBackend

__all__ = ["SummarizationEvalConfig"]


@dataclass
class SummarizationEvalConfig:
    """Evaluate a summarization policy (SLF5K-style): ROUGE, BLEU, BERTScore, perplexity, judged win rate."""

    dataset_path: str = config_field("", "Eval data: .jsonl/.json file, dataset directory, or hub id.")
    dataset_split: str | None = config_field(None, "Split for hub ids / dataset dicts (e.g. 'validation').")
    field_map: dict = config_field(
        {},
        "Rename fields, {our_name: their_name}, e.g. {\"reference\": \"tldr_human_reference_summary\"}.",
    )
    limit: int | None = config_field(None, "Evaluate only the first N records.")
    prompt_template: str = config_field(
        "Title: {title}\n\n{post}\n\nTL;DR:",
        "Generation prompt; {field} placeholders are filled from each record.",
    )
    reference_field: str = config_field("reference", "Record field holding the reference summary.")
    use_chat_template: bool = config_field(False, "Wrap prompts in the tokenizer's chat template.")
    system_prompt: str | None = config_field(None, "System message when use_chat_template is on.")

    model: str | None = config_field(None, "Policy: hub id, local dir, or adapter-only dir. Needed to generate or for perplexity.")
    adapter: str | None = config_field(None, "LoRA adapter directory applied on top of --model.")
    dtype: str = config_field("auto", "auto | bf16 | fp16 | fp32.")
    device: str | None = config_field(None, "cpu | cuda | cuda:N (default: GPU if visible).")
    generation_backend: GenerationBackend = config_field("hf", GENERATION_BACKEND_HELP)
    vllm_kwargs: dict[str, Any] = config_field({}, VLLM_KWARGS_HELP)
    batch_size: int = config_field(8, "Generation and perplexity batch size.")
    max_new_tokens: int = config_field(128, "Generated summary length limit (tokens).")
    max_prompt_length: int = config_field(1024, "Prompts longer than this are cut from the left.")
    do_sample: bool = config_field(False, "Sample instead of greedy decoding.")
    temperature: float = config_field(1.0, "Sampling temperature (do_sample only).")
    top_p: float = config_field(1.0, "Nucleus sampling (do_sample only).")
    stop_strings: list[str] = config_field([], "Strings that end a summary (e.g. '\\n\\n').")
    seed: int = config_field(0, "Seed for sampling.")

    predictions_file: str | None = config_field(
        None,
        "Score this JSONL of {id, prediction} instead of generating with --model.",
    )
    prediction_field: str = config_field("prediction", "Field of predictions files holding the output text.")

    metrics: list[str] = config_field(
        ["rouge", "bleu", "bertscore", "perplexity"],
        "Subset of rouge, bleu, bertscore, perplexity (perplexity needs --model).",
    )
    bertscore_model: str | None = config_field(
        None,
        "BERTScore model: hub id (e.g. roberta-large) or local dir; default the bundled all-MiniLM-L6-v2.",
    )
    bertscore_num_layers: int | None = config_field(None, "BERTScore layer (required for local dirs / unknown ids).")
    bertscore_batch_size: int = config_field(32, "BERTScore batch size.")
    reference_prefix: str = config_field(" ", "Prepended to each reference for perplexity (the separator after the prompt).")

    judge_model: str | None = config_field(None, "Judge model name; enables the judged win rate.")
    judge_base_url: str | None = config_field(None, "OpenAI-compatible endpoint of the judge (default: OpenAI).")
    judge_api_key_env: str = config_field("OPENAI_API_KEY", "Environment variable holding the judge's API key.")
    judge_prompt: str = config_field("summarization_pairwise", "Packaged template name or a template file.")
    judge_context_template: str = config_field(
        "Title: {title}\n\n{post}",
        "What the judge sees as the post ({field} placeholders).",
    )
    judge_concurrency: int = config_field(8, "Judge requests in flight at once.")
    judge_max_retries: int = config_field(5, "Retries per judge request on 429/5xx/timeouts.")
    judge_max_tokens: int = config_field(1024, "Judge answer length limit.")
    judge_seed: int = config_field(0, "Seed of the per-item A/B order.")
    baseline_predictions: str | None = config_field(
        None,
        "JSONL of {id, prediction} from the system to compare against.",
    )
    judge_against_reference: bool = config_field(
        False,
        "Compare against the reference summaries instead of --baseline_predictions.",
    )

    output_dir: str = config_field("runs/eval/slf5k", "Where reports and predictions are written.")
    name: str = config_field("summarization", "Report file stem: <name>.json and <name>.md.")
    progress_bar: bool = config_field(True, "Show progress bars.")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.metrics) - {"rouge", "bleu", "bertscore", "perplexity"})
        if unknown:
            raise ConfigError(f"unknown metric(s) {unknown}; choose from rouge, bleu, bertscore, perplexity")
        if not self.dataset_path:
            raise ConfigError("--dataset_path is required: a .jsonl/.json file, a saved dataset directory or a hub id")
        if self.model is None and self.predictions_file is None:
            raise ConfigError("pass --model (to generate summaries) or --predictions_file (to score existing ones)")
        if "perplexity" in self.metrics and self.model is None:
            raise ConfigError("perplexity needs --model; drop it from --metrics to score a predictions file alone")
        if self.judge_model and not (self.baseline_predictions or self.judge_against_reference):
            raise ConfigError("--judge_model needs a system to compare with: --baseline_predictions FILE or --judge_against_reference true")
