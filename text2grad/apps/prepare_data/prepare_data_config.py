"""The configuration of `text2grad prepare-data` (`PrepareDataConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from text2grad.core.config import ConfigError, config_field
from text2grad.core.generation_options import GENERATION_BACKEND_HELP, VLLM_KWARGS_HELP, GenerationBackend

__all__ = ["DEFAULT_FRACTIONS", "PrepareDataConfig"]


# How the training split is shared out, disjoint by prompt. UltraFeedback: the paper's 30 % SFT / 50 % reward
# model / 20 % RL. KodCode: the reward-model questions, the RL questions and a held-out evaluation set.
DEFAULT_FRACTIONS: dict[str, dict[str, float]] = {
    "ultrafeedback": {"sft": 0.3, "rm": 0.5, "rl": 0.2},
    "kodcode": {"rm": 0.5, "rl": 0.45, "eval": 0.05},
}


@dataclass
class PrepareDataConfig:
    """Turn a dataset in its native layout (hub id or local copy) into the files each phase reads."""

    dataset: Literal["slf5k", "kodcode", "ultrafeedback"] = config_field("slf5k", "Which of the paper's datasets the input is.")
    dataset_path: str = config_field("", "Hub id (JeremyAlain/SLF5K, KodCode/KodCode-Light-RL-10K, HuggingFaceH4/ultrafeedback_binarized) "
                        "or a local copy in the native layout: a save_to_disk directory, a directory of per-split "
                        "JSONL/parquet/arrow files named as on the hub, or one data file.")
    output_dir: str = config_field("", "Where annotation_input.jsonl, sft.jsonl, rl_prompts.jsonl, eval.jsonl, "
                             "preference_pairs.jsonl and prepare_report.json are written (e.g. data/slf5k).")
    seed: int = config_field(0, "Seed of the split into SFT / reward-model / RL parts (same seed, same split).")
    fractions: dict[str, float] = config_field({}, "Shares of the training split by prompt, e.g. '{\"sft\": 0.3, \"rm\": 0.5, "
                                         "\"rl\": 0.2}'. Empty: the dataset's default (UltraFeedback 30/50/20 as in the "
                                         "paper; KodCode rm 0.5 / rl 0.45 / eval 0.05). SLF5K uses its own splits.")
    eval_split: str | None = config_field(None, "Split written to eval.jsonl: SLF5K validation (or test/development), "
                                      "UltraFeedback test_prefs. KodCode has one split; its eval share comes from fractions.")
    max_samples: int | None = config_field(None, "Read at most this many rows per split (quick runs).")
    drop_ties: bool = config_field(False, "UltraFeedback: drop pairs whose score_chosen equals score_rejected (a tie "
                                   "states no preference). Kept by default, as released; either way every pair "
                                   "carries tie true/false and prepare_report.json counts them.")
    slf5k_prompt_template: str = config_field("Title: {title}\n\n{post}\n\nTL;DR:",
                                    "SLF5K policy prompt (sft, rl_prompts, preference_pairs, eval), filled from the "
                                    "row; keep it equal to configs/slf5k/eval.yaml's prompt_template.")
    # --- KodCode completions (the reward model's negatives) ---
    completions: str | None = config_field(None, "KodCode: a JSONL of model completions to score next to the references: "
                                       "question_id plus completion (a string) or completions (a list).")
    completions_model: str | None = config_field(None, "KodCode: a model (hub id or path) that writes completions for the "
                                             "reward-model questions (text2grad.core.generation).")
    completions_adapter: str | None = config_field(None, "KodCode: a PEFT adapter on top of completions_model.")
    completions_per_question: int = config_field(1, "KodCode: completions sampled per reward-model question.")
    max_new_tokens: int = config_field(512, "KodCode: generation length of one completion.")
    temperature: float = config_field(0.8, "KodCode: sampling temperature (0: greedy).")
    batch_size: int = config_field(8, "KodCode: prompts per generation batch.")
    use_chat_template: bool = config_field(True, "KodCode: wrap the prompt in the model's chat template when it has one.")
    dtype: str = config_field("auto", "KodCode: dtype of completions_model (auto, bf16, fp16, fp32).")
    generation_backend: GenerationBackend = config_field("hf", "KodCode completions: " + GENERATION_BACKEND_HELP)
    vllm_kwargs: dict[str, Any] = config_field({}, "KodCode completions: " + VLLM_KWARGS_HELP)
    test_timeout_s: float = config_field(10.0, "KodCode: time limit of one program's test run in the sandbox.")
    test_memory_mb: int = config_field(1024, "KodCode: memory limit of one test run.")
    workers: int = config_field(2, "KodCode: test runs in parallel (each in its own sandbox).")

    def __post_init__(self) -> None:
        for name, value in self.fractions.items():
            if not 0 <= float(value) <= 1:
                raise ConfigError(f"fractions[{name!r}] must be within [0, 1], got {value}")
        if self.fractions and abs(sum(self.fractions.values()) - 1.0) > 1e-6:
            raise ConfigError(f"fractions must sum to 1, got {self.fractions} (sum {sum(self.fractions.values())})")
        for name in ("completions_per_question", "batch_size", "workers", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples must be at least 1, got {self.max_samples}")

    def resolved_fractions(self) -> dict[str, float]:
        return dict(self.fractions or DEFAULT_FRACTIONS.get(self.dataset, {}))
