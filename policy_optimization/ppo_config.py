"""`PPOConfig`: every knob of Text2Grad PPO in one dataclass, TRL-PPOConfig names where TRL had them.

``python -m policy_optimization.train --config configs/slf5k/ppo.yaml --kl_coef 0.1`` reads the defaults,
then the YAML file, then the flags (`text2grad.core.config.parse_config`). Defaults follow the paper's SLF5K
setting (lr 1e-6, batch 12, 4 PPO epochs, initial KL coefficient 0.2 with adaptive control toward a
sequence KL of 6 nats, LoRA policy).

Batch arithmetic, global (the same run at any number of processes): each iteration samples ``batch_size``
rollouts over all processes, ``batch_size / N`` on each of N processes (`PPOConfig.process_batch`; N must divide
it). The rollouts split into ``num_mini_batches`` minibatches (one optimizer step each, per PPO epoch; each
process contributes its share of every minibatch and the gradients are averaged), and each process's share of
a minibatch into ``gradient_accumulation_steps`` micro-batches (one forward/backward each). Advantages (and
rewards, with ``whiten_rewards``) are whitened over the whole batch (``whiten_scope: global``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from text2grad.core.config import config_field, literal_choices, range_problems
from text2grad.core.model_config import ModelConfig, dtype_problem
from text2grad.core.reward_options import (
    REWARD_MODES,
    Aggregation,
    Boundary,
    Occurrence,
    Overlap,
    RewardMode,
    RewardScheme,
    TokenWeightingName,
)

__all__ = ["PPOConfig", "ProcessBatch", "REWARD_MODES", "SCALAR_SOURCES", "batch_split_problem"]

# Named sequence-score sources for the modes with a sequence score (SEQUENCE_SCORE_MODES: scalar, score_spread,
# mixed); any 'package.module:function' also works.
SCALAR_SOURCES = {
    "quote_count": None,  # (#good - #poor quotes) / (#good + #poor) of the same feedback; not the paper's baseline
    "scalar_rm": "reward_model.scalar:ScalarRewardScorer",  # Bradley-Terry reward model: the paper's PPO baseline
}


@dataclass
class PPOConfig(ModelConfig):
    """Text2Grad PPO: token-level rewards from natural-language feedback (Text2Grad, Sec. 3.5)."""

    # ---- models ------------------------------------------------------------------------------------
    adapter: str | None = config_field(
        None,
        "LoRA adapter to start from (e.g. the SFT output). It is merged into the base weights; with use_lora "
        "the merged model is saved once to <output_dir>/base_merged so the final PPO adapter has a loadable base.",
    )
    ref_model_name_or_path: str | None = config_field(
        None,
        "Separate reference policy. Default: the policy with its LoRA adapter disabled (no second copy in memory); "
        "without LoRA, a frozen copy of the initial policy.",
    )
    value_model_name_or_path: str | None = config_field(
        None,
        "Backbone of the value model (a separate causal LM with a scalar head; must share the policy's tokenizer). "
        "Default: the policy's model. A smaller model of the same family saves memory.",
    )
    value_model: Literal["auto", "shared_backbone", "separate"] = config_field(
        "auto",
        "Value function design. shared_backbone: a scalar head on the policy's own last hidden state (one forward "
        "pass, no second model; value gradients also train the policy's LoRA adapter). separate: a second backbone "
        "with a head (value_model_name_or_path). auto: shared_backbone for LoRA runs without "
        "value_model_name_or_path, else separate. Memory of both: benchmarks/README.md.",
    )
    lora_dropout: float = config_field(0.0, "LoRA dropout (dropout is disabled during PPO anyway, see README).")
    gradient_checkpointing: bool = config_field(False, "Gradient checkpointing for the policy and value backbones.")

    # ---- data --------------------------------------------------------------------------------------
    dataset_path: str = config_field("", "Prompts: a .jsonl/.json file, a saved datasets directory, or a hub id.")
    dataset_split: str = config_field("train", "Split for hub datasets.")
    field_map: dict[str, str] = config_field({}, "Rename record fields, {our_name: their_name}, before templates are filled.")
    prompt_template: str = config_field("{prompt}", "Policy prompt, with {field} placeholders filled from each record.")
    feedback_prompt_template: str | None = config_field(
        None,
        "The prompt the critic sees (e.g. '{post}' when the reward model was trained on bare posts). "
        "Default: the policy prompt before any chat template.",
    )
    use_chat_template: bool = config_field(False, "Wrap policy prompts in the tokenizer's chat template.")
    system_prompt: str | None = config_field(None, "System message for the chat template.")
    max_samples: int | None = config_field(None, "Use only the first N records.")
    max_prompt_length: int = config_field(
        512,
        "Prompts longer than this many tokens (chat template included) are cut from the left, keeping the end "
        "where the question is. Every configs/<dataset>/ppo.yaml sets it from its data.",
    )

    # ---- feedback and rewards ----------------------------------------------------------------------
    critic: str = config_field(
        "reward_model",
        "reward_model | llm | code_tests | reference | package.module:ClassName (the critic registry, text2grad/core/critics.py); 'none' "
        "only with reward_mode scalar and a scalar_source other than quote_count (the scalar baseline needs no critic).",
    )
    critic_kwargs: dict[str, Any] = config_field({}, "Keyword arguments for the critic's constructor, e.g. {\"path\": \"runs/slf5k/reward_model\"}.")
    reward_mode: RewardMode = config_field(
        "nl_gradient",
        "nl_gradient: span token rewards (the method); scalar: one sequence score at the last token (PPO baseline; "
        "with scalar_source scalar_rm it is the paper's PPO); dense: span token rewards from a critic/reward model "
        "that labels every part of the response (the paper's dense ablation; tokens/labelled_share is logged); "
        "score_spread: span rewards plus the sequence score spread over every other token; mixed: span rewards "
        "plus scalar_coef * sequence score at the last token; scalar_sum: the sum of the token rewards nl_gradient "
        "would give the response (same critic output, span alignment, scheme, weighting and normalisation) at its "
        "last token: the information-matched scalar baseline (same information, sequence-level credit).",
    )
    reward_scheme: RewardScheme = config_field("uniform", "Reward shape inside a span.")
    span_normalize: bool = config_field(False, "Divide each span's token rewards by its length (every span worth +-1).")
    reward_weighting: TokenWeightingName = config_field(
        "none",
        "Within-span token weights: pos_importance = the paper's token-importance ablation (1.0 on nouns and verbs, "
        "0.2 on other tokens; TextBlob's offline Pattern tagger, extra 'pos').",
    )
    boundary: Boundary = config_field("any", "Which tokens a span edge labels (text2grad.core.spans).")
    overlap: Overlap = config_field("poor", "Label that wins where a good and a poor span overlap.")
    occurrence: Occurrence = config_field("all", "Label every occurrence of a repeated quote, or the first.")
    scalar_source: str = config_field(
        "quote_count",
        "Sequence score for scalar/score_spread/mixed modes: scalar_rm = a Bradley-Terry reward model trained on "
        "preference pairs (reward_model.scalar; pass scalar_source_kwargs {\"path\": ...}), the paper's PPO "
        "baseline; quote_count = (#good - #poor quotes) / (#good + #poor) of the same feedback, in "
        "[-1, 1], a derived score and NOT the paper's baseline; or 'package.module:function' called as "
        "fn(prompts, responses) -> list[float].",
    )
    scalar_source_kwargs: dict[str, Any] = config_field({}, "Keyword arguments when scalar_source names a class (scalar_rm: path, ...).")

    # ---- defences against reward-model exploitation (policy_optimization/README.md) -----------------
    ensemble_aggregation: Aggregation = config_field(
        "vote",
        "How the members of an ensemble critic (reward_model_ensemble, ensemble) are combined per token "
        "(text2grad.core.ensemble): vote = a token is rewarded only where ensemble_min_votes members call it good "
        "and none calls it poor, penalised where any member calls it poor; mean_minus_std = mean - ensemble_std_coef * "
        "std of the members' token rewards. The sequence scores of the scalar modes are combined the same way. "
        "Ignored for a single critic.",
    )
    ensemble_min_votes: int | None = config_field(
        None, "vote: members that must call a token good for it to be rewarded (m of K); default all K."
    )
    ensemble_std_coef: float = config_field(1.0, "mean_minus_std: k, the number of standard deviations subtracted.")
    rm_refresh_every: int = config_field(
        0,
        "On-policy reward-model refresh (iterated RLHF, policy_optimization/rm_refresh.py): every N iterations the "
        "rm_refresh_critic annotates rm_refresh_samples of the iteration's rollouts and the reward model (the PPO "
        "critic: reward_model or reward_model_ensemble) is fine-tuned on them plus replayed earlier annotations. 0 = off.",
    )
    rm_refresh_samples: int | None = config_field(
        None, "Rollouts of a refresh iteration (over all processes) the annotating critic labels; default all batch_size."
    )
    rm_refresh_critic: str = config_field(
        "", "The annotating critic of a refresh: a registry name (llm, code_tests, reference, ...) or package.module:Name."
    )
    rm_refresh_critic_kwargs: dict[str, Any] = config_field({}, "Keyword arguments of rm_refresh_critic's constructor.")
    rm_refresh_replay: list[str] = config_field(
        [],
        "Earlier annotation files (e.g. the reward model's training JSONL) replayed with the new annotations so the "
        "model keeps what it knew; every earlier refresh's annotations are replayed as well.",
    )
    rm_refresh_replay_ratio: float = config_field(
        1.0, "Replayed records per new annotation in each refresh's fine-tuning data (0 = new annotations only)."
    )
    rm_refresh_steps: int = config_field(20, "Optimizer steps of each refresh's fine-tuning.")
    rm_refresh_batch_size: int = config_field(8, "Records per fine-tuning step of a refresh.")
    rm_refresh_micro_batch_size: int | None = config_field(
        2,
        "Records per forward/backward pass within a refresh step: the step's gradient is the same token mean, "
        "computed in pieces that hold fewer activations at once (benchmarks/rm_refresh_memory.py: pieces of 2 "
        "instead of 8 hold about a third of the memory). None: the whole rm_refresh_batch_size at once.",
    )
    rm_refresh_learning_rate: float = config_field(1e-4, "AdamW learning rate of a refresh's fine-tuning.")
    scalar_coef: float = config_field(1.0, "Weight of the sequence score.")
    missing_eos_penalty: float | None = config_field(
        None,
        "Subtracted from the reward of the last token of a response that hit response_length without EOS, in "
        "every reward_mode: on top of delta_t there in nl_gradient (which has no sequence score), of c*s there "
        "in scalar and mixed, of that token's share in score_spread. Empty responses pay it too (None or 0 = off).",
    )

    # ---- generation --------------------------------------------------------------------------------
    response_length: int = config_field(128, "Maximum new tokens per response.")
    temperature: float = config_field(0.7, "Sampling temperature (log-probs are computed at the same temperature).")
    top_p: float = config_field(1.0, "Nucleus sampling.")
    top_k: int = config_field(0, "Top-k sampling (0 = off).")
    stop_strings: list[str] | None = config_field(None, "Extra strings that end a response.")
    generation_batch_size: int | None = config_field(None, "Prompts per generate() call (default: the whole batch).")
    ds3_gather_for_generation: bool = config_field(
        True,
        "DeepSpeed ZeRO-3 only: gather the whole policy on every GPU while it samples (fast). false: each layer's "
        "weights are fetched as generation reaches it, so no GPU ever holds the whole policy (slower; for a policy "
        "that does not fit on one GPU next to the reward model). TRL's name for the same switch.",
    )
    generation_backend: Literal["hf", "vllm"] = config_field(
        "hf",
        "What samples the rollouts. hf: transformers' generate on the training model. vllm: a vLLM engine (extra "
        "'vllm'; under a launcher one per process, on the process's own GPU) that gets the current policy before "
        "every iteration (see vllm_lora_mode; full fine-tuning: the weights saved and reloaded in place), so "
        "rollouts stay on-policy. Old log-probs still come from the training model; vllm/logprob_abs_diff logs the mean "
        "|difference| to the engine's own log-probs of the sampled tokens as a check.",
    )
    vllm_lora_mode: Literal["auto", "merged", "adapter"] = config_field(
        "auto",
        "How the vLLM engine serves a LoRA policy (and a LoRA reward model on the same engine). adapter: as vLLM "
        "LoRA requests on the base weights. merged: the adapter folded into whole weights on the host and loaded "
        "into the engine in place each iteration, so the engine runs without LoRA kernels. auto: adapter on a GPU, "
        "merged on a CPU, where vLLM's LoRA kernels are slow (benchmarks/README.md, 'vLLM vs transformers generation').",
    )
    vllm_gpu_memory_utilization: float = config_field(
        0.3,
        "Share of its GPU that each process's vLLM engine takes (weights + KV cache, in (0, 1]); the rest is left to "
        "the models training on that GPU. Under a launcher process k's engine runs on visible GPU k. GPU only.",
    )
    vllm_cpu_kv_cache_gb: float = config_field(
        1.0,
        "KV cache of the vLLM engines on a CPU machine, in GiB, split evenly between the processes on the machine "
        "(VLLM_CPU_KVCACHE_SPACE, when the environment sets it, is used instead).",
    )
    vllm_kwargs: dict[str, Any] = config_field({}, "More vllm.LLM arguments, e.g. {\"max_model_len\": 2048}.")

    # ---- PPO ---------------------------------------------------------------------------------------
    num_iterations: int | None = config_field(None, "PPO iterations (rollout + update rounds).")
    total_episodes: int | None = config_field(None, "Alternative to num_iterations: episodes over all processes.")
    batch_size: int = config_field(
        12,
        "Rollouts per iteration over ALL processes (the global batch; the paper's SLF5K setting is 12). Each of N "
        "processes samples batch_size/N, so N must divide it (and each share must split into num_mini_batches x "
        "gradient_accumulation_steps); the same config gives the same run at any N. (TRL's old PPOTrainer, which "
        "the paper's code forked, counted it per process: use batch_size = 12 x N for that reading.)",
    )
    num_mini_batches: int = config_field(1, "Minibatches (optimizer steps) per PPO epoch, each of batch_size/num_mini_batches rollouts over all processes.")
    gradient_accumulation_steps: int = config_field(1, "Micro-batches per minibatch on each process (forward/backward chunks).")
    num_ppo_epochs: int = config_field(4, "Passes over each batch of rollouts.")
    learning_rate: float = config_field(1e-6, "Policy learning rate.")
    value_learning_rate: float | None = config_field(None, "Value model learning rate (default: learning_rate).")
    lr_scheduler_type: str = config_field("linear", "transformers scheduler name: linear, cosine, constant, ...")
    warmup_steps: int = config_field(0, "Scheduler warm-up in optimizer steps.")
    weight_decay: float = config_field(0.0, "AdamW weight decay.")
    max_grad_norm: float = config_field(1.0, "Gradient clipping (0 = off).")
    kl_coef: float = config_field(0.2, "Initial KL penalty coefficient (beta of r_t^KL = -kl_coef * KL_t).")
    kl_estimator: Literal["k1", "k3"] = config_field("k1", "Per-token KL estimator (text2grad.core.ppo_math.kl_penalty).")
    adaptive_kl: bool = config_field(True, "Adapt kl_coef toward target_kl (Ziegler et al. controller).")
    target_kl: float = config_field(6.0, "Target sequence KL (nats, summed over response tokens) for adaptive control.")
    kl_horizon: int = config_field(
        10,
        "Horizon of the adaptive KL controller, in kl_horizon_unit: each iteration multiplies kl_coef by "
        "1 + clip(KL / target_kl - 1, -0.2, 0.2) * steps / kl_horizon (Ziegler et al. 2019). Default: 10 "
        "iterations, so the coefficient can move by up to 2 % per iteration (x5.9 over 90 iterations) and "
        "the target binds within a short run. The paper's code (TRL) used 10,000 episodes: set kl_horizon 10000 "
        "with kl_horizon_unit episodes; over a run of a few thousand episodes it moves kl_coef by at most ~e^0.2.",
    )
    kl_horizon_unit: Literal["iterations", "episodes"] = config_field(
        "iterations",
        "Unit of kl_horizon: iterations = PPO iterations of this run (one controller step each); episodes = "
        "rollouts (each iteration advances the controller by batch_size, as in TRL, OpenRLHF and verl).",
    )
    cliprange: float = config_field(0.2, "PPO policy ratio clip.")
    cliprange_value: float = config_field(0.2, "Value prediction clip.")
    vf_coef: float = config_field(0.1, "Value loss weight.")
    entropy_coef: float = config_field(0.0, "Entropy bonus weight (beta in the paper's L^PPO).")
    gamma: float = config_field(1.0, "Discount factor.")
    lam: float = config_field(0.95, "GAE lambda.")
    whiten_rewards: bool = config_field(False, "Scale total token rewards to unit variance per batch (mean kept).")
    whiten_advantages: bool = config_field(True, "Normalize advantages per batch.")
    whiten_scope: Literal["global", "process"] = config_field(
        "global",
        "Which batch whiten_advantages / whiten_rewards (and value/explained_variance) take their mean and variance "
        "from: global = all processes' rollouts together (summed statistics; the same numbers at any process "
        "count), process = each process's own share (TRL's behaviour; differs with the process count).",
    )

    # ---- run ---------------------------------------------------------------------------------------
    output_dir: str = config_field("outputs/ppo", "Checkpoints, metrics.jsonl, samples.jsonl and the final policy/value model.")
    overwrite_output_dir: bool = config_field(False, "Start fresh even if output_dir holds checkpoints of an earlier run.")
    resume: str | None = config_field(None, "'auto' = continue from the latest checkpoint in output_dir if any; or a checkpoint dir.")
    accept_config_changes: bool = config_field(
        False,
        "Resume even though the config differs from the checkpoint's (the differences are logged and appended to "
        "<output_dir>/config_changes.jsonl). Without it such a resume is refused.",
    )
    max_feedback_error_rate: float = config_field(
        0.2,
        "Stop (exit 1, before the update) when more than this share of an iteration's samples gets no feedback "
        "(source errors, unparseable feedback, failed scores); 1.0 never stops. Every iteration with errors logs a warning.",
    )
    save_steps: int = config_field(50, "Save a checkpoint every N iterations (0 = only at the end).")
    save_total_limit: int | None = config_field(
        2, "Keep at most this many checkpoints, >= 1 (oldest removed); null/none keeps every checkpoint."
    )
    seed: int = config_field(42, "Random seed (data order, LoRA init, sampling).")
    report_to: Literal["none", "tensorboard", "wandb"] = config_field("none", "Extra metric sink besides metrics.jsonl.")
    run_name: str | None = config_field(None, "Run name for TensorBoard/W&B.")
    log_samples: int = config_field(2, "Write this many (prompt, response, feedback, rewards) examples per iteration to samples.jsonl.")
    progress_bar: bool = config_field(True, "Show a tqdm progress bar over iterations.")

    def __post_init__(self) -> None:
        # The CLI checks Literal fields while parsing; this also covers PPOConfig(...) built in Python, which
        # would otherwise fail much later (e.g. report_to="tb" as a bare KeyError when the trainer starts).
        problems = [
            f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}"
            for name, allowed in literal_choices(PPOConfig).items()
            if getattr(self, name) not in allowed
        ]
        problems += range_problems(
            self,
            positive=("learning_rate", "value_learning_rate", "lora_r", "lora_alpha", "max_samples", "max_prompt_length",
                      "top_p", "generation_batch_size", "vllm_cpu_kv_cache_gb", "vllm_gpu_memory_utilization"),
            non_negative=("warmup_steps", "weight_decay", "max_grad_norm", "kl_coef", "vf_coef", "entropy_coef",
                          "top_k", "log_samples", "missing_eos_penalty"),
            share=("lora_dropout", "top_p", "vllm_gpu_memory_utilization"),
        )

        if problem := dtype_problem(self.dtype):
            problems.append(problem)
        for name in ("batch_size", "num_mini_batches", "gradient_accumulation_steps", "num_ppo_epochs", "response_length", "max_prompt_length"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if min(self.batch_size, self.num_mini_batches, self.gradient_accumulation_steps) >= 1:
            split = batch_split_problem(self.batch_size, 1, self.num_mini_batches, self.gradient_accumulation_steps)
            if split:
                problems.append(split)
        if not 0 <= self.max_feedback_error_rate <= 1:
            problems.append(f"max_feedback_error_rate is a share in [0, 1], got {self.max_feedback_error_rate}")
        if self.temperature <= 0:
            problems.append(f"temperature must be > 0 (sampling is required for PPO), got {self.temperature}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            problems.append(f"gamma and lam must lie in [0, 1], got gamma={self.gamma}, lam={self.lam}")
        if self.cliprange <= 0 or self.cliprange_value <= 0:
            problems.append("cliprange and cliprange_value must be > 0")
        if self.target_kl <= 0 or self.kl_horizon <= 0:
            problems.append("target_kl and kl_horizon must be > 0")
        elif self.adaptive_kl and self.kl_horizon_unit == "iterations" and self.kl_horizon > 1000:
            problems.append(
                f"kl_horizon {self.kl_horizon} is counted in iterations (kl_horizon_unit), so the KL controller would "
                "hardly move: pass kl_horizon_unit episodes for an episode horizon such as the paper's 10000, or "
                "a horizon of a few to a few hundred iterations")
        if self.num_iterations is not None and self.num_iterations < 1:
            problems.append(f"num_iterations must be >= 1, got {self.num_iterations}")
        if self.total_episodes is not None and self.total_episodes < 1:
            problems.append(f"total_episodes must be >= 1, got {self.total_episodes}")
        if self.save_steps < 0:
            problems.append(f"save_steps must be >= 0, got {self.save_steps}")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            problems.append(
                f"save_total_limit must be >= 1, got {self.save_total_limit} (use null/none to keep every checkpoint)"
            )
        if self.scalar_source == "spans":  # an old value fails like an old key: named, never taken silently
            problems.append(
                "scalar_source 'spans' was renamed to quote_count: use --scalar_source quote_count on the command line "
                "or 'scalar_source: quote_count' in a YAML file"
            )
        elif self.scalar_source not in SCALAR_SOURCES and ":" not in self.scalar_source:
            problems.append(
                f"scalar_source must be one of {list(SCALAR_SOURCES)} or 'package.module:function', got {self.scalar_source!r}"
            )
        if self.critic == "none" and (self.reward_mode != "scalar" or self.scalar_source == "quote_count"):
            problems.append(
                "critic 'none' only works with reward_mode scalar and a scalar_source other than quote_count "
                "(every other mode reads spans from the feedback)"
            )
        if self.ensemble_min_votes is not None and self.ensemble_min_votes < 1:
            problems.append(f"ensemble_min_votes must be >= 1 (or null for all members), got {self.ensemble_min_votes}")
        if self.ensemble_std_coef < 0:
            problems.append(f"ensemble_std_coef must be >= 0, got {self.ensemble_std_coef}")
        problems += self._rm_refresh_problems()
        if self.value_model == "shared_backbone" and self.value_model_name_or_path:
            problems.append("value_model_name_or_path names a separate value model: set value_model to separate (or auto)")
        if problems:
            raise ValueError("invalid PPOConfig: " + "; ".join(problems))

    def _rm_refresh_problems(self) -> list[str]:
        if self.rm_refresh_every < 0:
            return [f"rm_refresh_every must be >= 0 (0 = off), got {self.rm_refresh_every}"]
        if not self.rm_refresh_every:
            return []
        problems = []
        if not self.rm_refresh_critic:
            problems.append("rm_refresh_every needs rm_refresh_critic: the critic that annotates the rollouts "
                            "(e.g. --rm_refresh_critic llm, or the task's checker as package.module:Name)")
        if self.critic not in ("reward_model", "reward_model_ensemble"):
            problems.append(f"rm_refresh_every fine-tunes the PPO critic, which must be a reward model "
                            f"(critic reward_model or reward_model_ensemble), got critic {self.critic!r}")
        for name in ("rm_refresh_samples", "rm_refresh_steps", "rm_refresh_batch_size", "rm_refresh_micro_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        if self.rm_refresh_learning_rate <= 0 or self.rm_refresh_replay_ratio < 0:
            problems.append("rm_refresh_learning_rate must be > 0 and rm_refresh_replay_ratio >= 0")
        return problems

    @property
    def value_design(self) -> str:
        """``value_model`` with "auto" resolved: "shared_backbone" or "separate"."""
        if self.value_model != "auto":
            return self.value_model
        return "shared_backbone" if self.use_lora and not self.value_model_name_or_path else "separate"

    # ---- derived sizes -----------------------------------------------------------------------------
    def process_batch(self, num_processes: int = 1) -> "ProcessBatch":
        """One process's share of the iteration's ``batch_size`` rollouts when ``num_processes`` share it; a
        ValueError that says which sizes work when it does not split evenly."""
        problem = batch_split_problem(self.batch_size, num_processes, self.num_mini_batches, self.gradient_accumulation_steps)
        if problem:
            raise ValueError(problem)
        rollouts = self.batch_size // num_processes
        mini_batch = rollouts // self.num_mini_batches
        return ProcessBatch(rollouts, mini_batch, mini_batch // self.gradient_accumulation_steps)

    def iterations(self) -> int:
        """How many PPO iterations this config asks for (the same at any number of processes)."""
        if self.num_iterations is not None:
            return self.num_iterations
        if self.total_episodes is not None:
            return math.ceil(self.total_episodes / self.batch_size)
        raise ValueError("set num_iterations or total_episodes (how long to train)")


@dataclass(frozen=True)
class ProcessBatch:
    """One process's share of a PPO iteration (`PPOConfig.process_batch`)."""

    rollouts: int  # rollouts this process samples per iteration (batch_size / processes)
    mini_batch: int  # of them, per optimizer step
    micro_batch: int  # of them, per forward/backward pass


def batch_split_problem(batch_size: int, num_processes: int, num_mini_batches: int, accumulation: int) -> str | None:
    """Why ``batch_size`` rollouts do not split evenly over ``num_processes`` processes x ``num_mini_batches``
    minibatches x ``accumulation`` micro-batches (what to change, with sizes that work), or None if they do."""
    step = num_processes * num_mini_batches * accumulation
    if batch_size % step == 0:
        return None
    lower, upper = batch_size // step * step, (batch_size // step + 1) * step
    sizes = f"{lower} or {upper}" if lower else f"{upper}"
    parts = [f"{num_processes} processes"] if num_processes > 1 else []
    parts += [f"num_mini_batches {num_mini_batches}"] + ([f"gradient_accumulation_steps {accumulation}"] if accumulation > 1 else [])
    counts = [n for n in range(1, batch_size + 1) if batch_size % (n * num_mini_batches * accumulation) == 0]
    where = (f"; or launch a number of processes that works with this batch: {', '.join(map(str, counts))}"
             if num_processes > 1 and counts else "")
    product = " x ".join(parts) + (f" = {step}" if len(parts) > 1 else "")
    return (
        f"batch_size {batch_size} (rollouts per iteration over all processes) must be divisible by "
        f"{product}, so every process gets the same whole number of rollouts per micro-batch: "
        f"set batch_size to a multiple of {step} (e.g. {sizes}), or lower num_mini_batches / "
        f"gradient_accumulation_steps{where}"
    )

