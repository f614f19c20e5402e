"""The configuration of `python -m reward_model.evaluate` / `text2grad eval-rm` (`EvalConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from text2grad.core.config import config_field
from text2grad.core.spans import Boundary, Occurrence, Overlap

__all__ = ["EvalConfig"]


@dataclass
class EvalConfig:
    """Evaluate a generative reward model (or saved critic outputs) against annotated feedback."""

    model_name_or_path: str = config_field(
        "",
        "Reward model: training output dir (adapter), merged model, base model with --adapter, or an ensemble "
        "directory (member-<k>/ inside, from reward_model.train --ensemble_size K).",
    )
    adapter: str | None = config_field(None, "LoRA adapter directory on top of model_name_or_path.")
    ensemble_min_votes: int | None = config_field(
        None,
        "Ensemble directories: a good quote counts where at least this many members quote it (default: all); "
        "every member's poor quotes count.",
    )
    dataset_path: str = config_field("", "Annotated held-out data (JSONL/JSON/dataset dir/hub id).")
    dataset_split: str = config_field("validation", "Split when dataset_path is a hub dataset.")
    field_map: dict[str, str] = config_field({}, "Rename fields, {our_name: their_name}.")
    limit: int | None = config_field(None, "Evaluate only the first N records.")
    output_dir: str = config_field("outputs/reward_model_eval", "Where the report files go.")
    predictions_file: str | None = config_field(
        None,
        "Score these saved critic outputs instead of running a model.",
    )
    label_tokenizer: str | None = config_field(
        None,
        "Tokenizer whose tokens the token-level metrics count (e.g. the policy's); "
        "defaults to the reward model's tokenizer.",
    )
    instruction: str | None = config_field(
        None,
        "Override the instruction saved with the model (for models trained without text2grad).",
    )
    prompt_format: Literal["auto", "chat", "plain"] | None = config_field(
        None,
        "Override the saved prompt format.",
    )
    batch_size: int = config_field(16, "Generation batch size.")
    max_new_tokens: int = config_field(512, "Bound on the generated critique + JSON.")
    dtype: str = config_field("auto", "auto, bf16, fp16 or fp32.")
    backend: Literal["hf", "vllm"] = config_field("hf", "Generation backend.")
    grounded_spans: bool = config_field(
        False,
        "Grounded span decoding: force every quote to be a substring of the response (either backend).",
    )
    occurrence: Occurrence = config_field("all", "Label all occurrences of a repeated quote, or the first.")
    overlap: Overlap = config_field("poor", "Which label wins where good and poor spans overlap.")
    boundary: Boundary = config_field("any", "Token boundary rule: any, majority or all.")
