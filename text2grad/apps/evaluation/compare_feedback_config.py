"""The configuration of `text2grad compare-feedback` (`CompareConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from text2grad.core.config import config_field

__all__ = ["CompareConfig"]


@dataclass
class CompareConfig:
    """Judge two critics' feedback pairwise and score both against reference annotations."""

    dataset_path: str = config_field("", "Held-out annotation records (prompt, response, critique, good_spans, poor_spans).")
    limit: int | None = config_field(None, "Use only the first N records.")
    candidate_critic: str = config_field("reward_model", "The candidate critic (e.g. the CoT reward model).")
    candidate_critic_kwargs: dict[str, Any] = config_field({}, "Its keyword arguments, e.g. {\"path\": \"runs/slf5k/reward_model\"}.")
    baseline_critic: str = config_field("reward_model", "The baseline critic (e.g. the no-CoT reward model).")
    baseline_critic_kwargs: dict[str, Any] = config_field({}, "Its keyword arguments.")
    tokenizer: str = config_field("", "Tokenizer for the token metrics (e.g. the policy's or a reward model's directory).")
    judge_model: str = config_field("gpt-4o", "Judge model name.")
    base_url: str | None = config_field(None, "OpenAI-compatible endpoint of the judge (default: the OpenAI API).")
    api_key_env: str = config_field("OPENAI_API_KEY", "Environment variable with the judge's API key.")
    judge_template: str = config_field("feedback_pairwise", "Judge prompt: packaged name or a file with {instruction}, {output_a}, {output_b}.")
    concurrency: int = config_field(8, "Judge requests in flight.")
    seed: int = config_field(0, "Seed of the order in which the two feedbacks are shown.")
    output_dir: str = config_field("outputs/compare_feedback", "report.json and judgments.jsonl go here.")
