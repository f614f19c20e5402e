"""The quickstart's size presets (`PRESETS`, `PRESET_ARGS`) and `resolve`, which fills a `QuickstartConfig`'s None
fields from its preset, finds the SmolLM2 model the smollm2 preset names (converted from the installed asset once)
and checks the result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from text2grad.apps.quickstart.quickstart_config import SMOLLM2, QuickstartConfig
from text2grad.core.assets import AssetMissingError, smollm2_path
from text2grad.core.config import ConfigError
from text2grad.core.reward_options import REWARD_MODES
from text2grad.core.vllm_engine import vllm_available, vllm_missing_message

__all__ = ["PRESETS", "PRESET_ARGS", "SMOLLM2_ASSET_HINT", "SMOLLM2_VLLM_HINT", "resolve"]


# Preset values for every None field of `QuickstartConfig`. ``default`` takes ~3-4 min on 2 idle CPU cores
# (benchmarks/quickstart_time.py).
PRESETS: dict[str, dict[str, Any]] = {
    "ci": dict(
        # big enough that every phase does something (the reward model writes valid JSON, PPO moves the policy),
        # so tests/apps/quickstart/expected_ci_results.json pins real numbers
        n_train=160, n_rl=32, n_eval=16, vocab_size=420, hidden_size=32, num_layers=2, intermediate_size=0, sft_steps=200,
        sft_learning_rate=3e-3, sft_decay_steps=0, n_annotations=96, rm_steps=150, rm_learning_rate=2e-3, ppo_iterations=4,
        ppo_batch_size=8, ppo_learning_rate=3e-4, kl_coef=0.05, gae_lambda=0.0, eval_every=2, use_chat_template=False,
        mode_ppo_args={"scalar": ["--lam", "0.95"]},  # each mode at its own lambda chosen on validation
        decode_threads=1, parallel_modes=True,  # decoding on one thread, the modes side by side
        max_feedback_error_rate=1.0,  # the tiny reward model fails on up to 3 of 8 samples of an iteration
    ),
    "default": dict(
        # SFT: the first 600 steps of a 1200-step decay (policy_sft_steps = sft_steps: the reward model starts from
        # the PPO policy); 600 reward-model steps in length-grouped batches (1.5x faster than 1200/800). 3,000
        # annotations are capped at the 2,000 train posts: 1,500 policy samples and 500 noisy summaries.
        n_train=2000, n_rl=256, n_eval=100, vocab_size=800, hidden_size=128, num_layers=2, intermediate_size=0, sft_steps=600,
        policy_sft_steps=600, sft_learning_rate=3e-3, sft_decay_steps=1200, n_annotations=3000, rm_steps=600,
        rm_learning_rate=2e-3, ppo_iterations=30,
        ppo_batch_size=16, ppo_learning_rate=1e-4, kl_coef=0.1, gae_lambda=0.0, eval_every=10, use_chat_template=False,
        mode_ppo_args={"scalar": ["--lam", "0.95"]},  # each mode at its own lambda chosen on validation
        decode_threads=1, parallel_modes=True,  # decoding on one thread, the modes side by side
        max_feedback_error_rate=0.2,  # measured (ppo_seed 0 and 1): 1 failed of 1,920 PPO samples, worst iteration 1 of 16
    ),
    # The pretrained SmolLM2-135M-Instruct for every phase: it already summarizes, so there is no SFT (it is both the
    # PPO start and the reward model's base); LoRA reward model and LoRA policy (PRESET_ARGS), prompted through its
    # chat template. Sized to run end to end on 2 CPU cores in about half an hour (measured: benchmarks/README.md);
    # the GPU-sized settings are flags in the quickstart README (--n_annotations 512 --rm_steps 120 --ppo_iterations 20 ...).
    "smollm2": dict(
        sft_model=SMOLLM2, n_train=600, n_rl=64, n_eval=32, vocab_size=0, hidden_size=0, num_layers=0, intermediate_size=0, sft_steps=1,
        policy_sft_steps=1, sft_learning_rate=0.0, sft_decay_steps=0, n_annotations=160, rm_steps=40, rm_learning_rate=1e-3,
        ppo_iterations=8, ppo_batch_size=8, ppo_learning_rate=1e-4, kl_coef=0.05, gae_lambda=0.0, eval_every=4, use_chat_template=True,
        decode_threads=0, parallel_modes=False, max_feedback_error_rate=0.2,
    ),
    "large": dict(
        n_train=4000, n_rl=1024, n_eval=300, vocab_size=1000, hidden_size=192, num_layers=4, intermediate_size=0, sft_steps=2000,
        sft_learning_rate=2e-3, sft_decay_steps=0, n_annotations=3000, rm_steps=1500, rm_learning_rate=1e-3, ppo_iterations=150,
        ppo_batch_size=32, ppo_learning_rate=1e-4, kl_coef=0.1, gae_lambda=0.0, eval_every=25, use_chat_template=False,
        mode_ppo_args={"scalar": ["--lam", "0.95"]},  # each mode at its own lambda chosen on validation
        decode_threads=1, parallel_modes=True,  # decoding on one thread, the modes side by side
        max_feedback_error_rate=0.2,
    ),
}

# Flags a preset puts before the user's own --sft_args/--rm_args/--ppo_args (later flags win).
PRESET_ARGS: dict[str, dict[str, list[str]]] = {
    "smollm2": dict(
        # batches of 8 in micro-batches of 2: the same optimizer steps with a quarter of the activations and full-vocabulary
        # logits resident (49k tokens x 8 x 320 positions x 4 B = 0.5 GB per copy of the logits at micro-batch 8)
        rm_args=["--use_lora", "true", "--lora_r", "16", "--lora_alpha", "32", "--per_device_train_batch_size", "2",
                 "--gradient_accumulation_steps", "4", "--max_length", "320"],
        ppo_args=["--use_lora", "true", "--lora_r", "16", "--lora_alpha", "32"],
    ),
}


# How to add what the smollm2 preset uses to a lean install (bash scripts/quickstart.sh adds the asset by itself).
SMOLLM2_ASSET_HINT = ("the smollm2 preset needs the SmolLM2-135M-Instruct asset (the real-assets extra): run "
                      "`bash scripts/quickstart.sh --preset smollm2`, which installs it, or "
                      "`TEXT2GRAD_EXTRAS=real-assets bash env.sh`")
SMOLLM2_VLLM_HINT = ("vLLM is not installed, so the smollm2 preset samples and critiques with transformers (its PPO "
                     "iterations about 1.5x slower on a CPU; benchmarks/README.md). To add vLLM: "
                     "`TEXT2GRAD_EXTRAS=real-assets,vllm bash env.sh`")


def _smollm2_folder(preset: str) -> Path:
    """The converted SmolLM2 folder, or a ConfigError that says which install adds it."""
    try:
        return smollm2_path()
    except AssetMissingError as exc:
        hint = SMOLLM2_ASSET_HINT if preset == SMOLLM2 else "it ships in the real-assets extra"
        raise ConfigError(f"{exc}; {hint}") from None


def resolve(cfg: QuickstartConfig) -> QuickstartConfig:
    """Fill None fields from the preset; check the result."""
    if cfg.preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {cfg.preset!r}")
    values = {k: v for k, v in PRESETS[cfg.preset].items() if getattr(cfg, k) is None}
    out = replace(cfg, **values)
    for name, flags in PRESET_ARGS.get(cfg.preset, {}).items():
        out = replace(out, **{name: [*flags, *getattr(out, name)]})
    for name in ("sft_model", "policy_model", "rm_base_model"):
        if getattr(out, name) == SMOLLM2:  # converted from the installed GGUF once, then cached
            out = replace(out, **{name: str(_smollm2_folder(cfg.preset))})
    if out.mode_ppo_args is None:
        out = replace(out, mode_ppo_args={})
    unknown = sorted(set(out.mode_ppo_args) - set(REWARD_MODES))
    if unknown:
        raise ValueError(f"mode_ppo_args has settings for unknown modes {unknown}; the modes are {', '.join(REWARD_MODES)}")
    if out.ppo_seed is None:
        out = replace(out, ppo_seed=out.seed)
    if out.generation_backend is None:
        out = replace(out, generation_backend="vllm" if cfg.preset == "smollm2" and vllm_available() else "hf")
    elif out.generation_backend == "vllm" and not vllm_available():
        raise ConfigError(vllm_missing_message("--generation_backend vllm"))
    if out.policy_sft_steps is None:
        out = replace(out, policy_sft_steps=max(1, out.sft_steps // 2))
    bad = [m for m in out.modes if m not in REWARD_MODES]
    if bad or not out.modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(REWARD_MODES)}; got {out.modes}")
    if out.decode_threads < 0:
        raise ValueError(f"decode_threads must be >= 0 (0: torch's default); got {out.decode_threads}")
    if out.rm_extra_policy_samples < 0:
        raise ValueError(f"rm_extra_policy_samples must be >= 0 (0: none); got {out.rm_extra_policy_samples}")
    if out.rm_extra_noisy_summaries < 0:
        raise ValueError(f"rm_extra_noisy_summaries must be >= 0 (0: none); got {out.rm_extra_noisy_summaries}")
    if out.rm_extra_replace_noisy and not (out.rm_extra_policy_samples or out.rm_extra_noisy_summaries):
        raise ValueError("rm_extra_replace_noisy needs rm_extra_policy_samples or rm_extra_noisy_summaries > 0 (the "
                         "annotations that take the noisy summaries' place); got 0 and 0")
    if out.ppo_iterations < 1 or out.eval_every < 1 or out.n_val < 1 or out.rm_refresh_steps < 1:
        raise ValueError("ppo_iterations, eval_every, n_val and rm_refresh_steps must be >= 1")
    if out.sft_decay_steps and out.sft_decay_steps < out.sft_steps:
        raise ValueError(f"sft_decay_steps must be 0 or >= sft_steps ({out.sft_steps}); got {out.sft_decay_steps}")
    if out.use_chat_template and out.policy_model is None and out.sft_model is None:
        raise ValueError("use_chat_template needs a policy whose tokenizer has a chat template (--policy_model or "
                         "--sft_model); the tiny Llama's tokenizer has none: pass --use_chat_template false")
    if not 1 <= out.policy_sft_steps <= out.sft_steps:
        raise ValueError(f"policy_sft_steps must be between 1 and sft_steps ({out.sft_steps}); got {out.policy_sft_steps}")
    return out
