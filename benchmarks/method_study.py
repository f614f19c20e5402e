"""The method study: Text2Grad against its scalar and dense baselines, each tuned on validation, over seeds.

    python benchmarks/method_study.py --output_dir runs/method_study                      # every phase (hours)
    python benchmarks/method_study.py --output_dir runs/method_study --phases sweep final --arms oracle
    python benchmarks/method_study.py --output_dir runs/method_study --phases report      # reports only (trains nothing)
    python benchmarks/method_study.py --output_dir runs/study_v2 --task_seeds 0 1 2 --arms learned \
        --methods text2grad scalar_sum scalar_collapsed scalar_bt --variants ensemble refresh ensemble_refresh \
        --phases sweep final report --export_to benchmarks/results/method_study_v2   # several task instances
    python benchmarks/method_study.py --output_dir /tmp/ms --iterations 4 --eval_every 2 --preset ci --jobs 1  # smoke
    python benchmarks/method_study.py --output_dir runs/study_smollm2 --preset smollm2 --arms oracle \
        --methods text2grad scalar_collapsed --sweep_knobs lambda lr --lambdas 0 0.95 --lrs 3e-5 --seeds 0 1 2 \
        --iterations 12 --eval_every 6 --phases sweep final report
    python benchmarks/method_study.py --output_dir runs/study_v2 --task_seeds 0 1 2 --arms learned \
        --methods text2grad scalar_sum scalar_collapsed --kl_frontier 0.3 1.0 --phases frontier report  # KL frontier
    python benchmarks/method_study.py --output_dir runs/study_v2 --task_seeds 0 1 2 --arms learned \
        --methods text2grad scalar_sum --lr_frontier 3.3e-6 1e-5 --phases frontier report  # the step size's points

Every method starts from the same SFT policy of the quickstart task (`text2grad.apps.quickstart`) and gets the same
number of rollouts (``iterations`` x the preset's PPO batch). ``--preset smollm2`` runs the paper's pipeline order on
the real SmolLM2-135M-Instruct: LoRA SFT on the task first (through its chat template; the adapter is merged once into
the study's start policy), then LoRA PPO (r 16) from it; the reward models are trained only when a learned arm or the
Bradley-Terry baseline asks for them. Methods (PPO reward modes of `policy_optimization`):

====================  ==========================================================================================
``text2grad``         span token rewards from the critic's good/poor quotes (``reward_mode nl_gradient``)
``scalar_sum``        the sum of exactly those token rewards at the last token (``reward_mode scalar_sum``): the
                      same information with sequence-level credit, the information-matched baseline
``scalar_collapsed``  the same critic's feedback collapsed to one number at the last token:
                      ``(#good - #poor quotes) / (#good + #poor)`` (``reward_mode scalar``, ``quote_count``)
``dense``             span token rewards from a critic that labels every clause (``reward_mode dense``)
``scalar_bt``         the score of a Bradley-Terry reward model trained on preference pairs at the last token
                      (the paper's PPO baseline; it reads no critic and runs under the learned arm; on SmolLM2 it
                      trains with the generative reward model's budget, `scalar_rm_recipe`)
``scalar_task``       the task's own fact score at the last token (oracle arm only: the strongest scalar baseline)
====================  ==========================================================================================

``--variants`` adds the defences against reward-model exploitation (`VARIANTS`: a reward-model ensemble, an on-policy
reward-model refresh, both) as learned-arm methods ``text2grad+<variant>`` and ``scalar_sum+<variant>``, and the
refresh's equal-annotation control ``offline_matched`` (the reward model trained offline on as many more annotations,
for as many more steps, as the refresh adds over a run: the SFT policy's samples on the prompts the refresh annotates)
and its step control ``steps_matched`` (the reward model trained on its own annotations only, for as many more steps)
and kind control ``swap_matched`` (the control's samples in place of as many noisy summaries, for as many more steps),
and ``prompts_matched`` (as swap_matched, with noisy summaries of the same RL posts in place of the policy's samples);
``rl_covered`` annotates a noisy summary of every RL post in place of as many others, at the base reward model's steps.
``--task_seeds`` runs the whole study on several task instances, each in ``<output_dir>/task_seed<N>``, and reports
each instance and all pooled (`benchmarks/method_study_report.py` holds the statistics and the report).

Feedback arms: ``oracle`` = the task's programmatic critic (`FactCritic`, or its dense version) gives the feedback
directly, which isolates credit assignment; ``learned`` = the generative reward model trained on the critic's
annotations gives it, as in the paper.

Phases (each resumable: a run whose ``result.json`` exists is not run again; with ``--checkpoint_runs``, on by
default for ``--preset smollm2``, a run killed midway resumes from its last evaluation point). Several study processes
may share one folder and one task instance (e.g. one run each, ``--seeds 3 --jobs 1``, queued n at a time): each run
writes only its own folder, and the instance's data and reports are replaced whole, never torn:

- ``sweep``: per (arm, method) a coordinate search on the VALIDATION split, seed ``--sweep_seed``: GAE lambda in
  {0, 0.95, 1.0} at the base setting, then the learning rate around the base at the best lambda, then KL control:
  the adaptive controller (horizon ``--kl_horizon`` iterations) and fixed coefficients ``--kl_coefs``. A learning
  rate or fixed coefficient chosen at the edge of the values tried grows the grid by x3 past it (``--grid_extensions``
  times). The criterion is the mean validation fact score of the last two evaluation points (the end of training, not
  a peak).
- ``final``: every (arm, method) at its chosen setting, ``--seeds``; each evaluation point scores validation AND test.
- ``frontier``: every (arm, method) again on the final seeds at each fixed KL coefficient of ``--kl_frontier`` (its
  chosen learning rate and lambda kept), so each method has a curve of final score against final KL. The report then
  also compares Text2Grad held to the KL of the best scalar baseline, and of the information-matched scalar_sum: its
  KL setting is chosen on validation among those whose mean final KL is no larger than the baseline's, and compared
  with the baseline on test, seed by seed (a method that wins only by drifting further from the start is not winning).
  Where scalar_sum has frontier points of its own, Text2Grad is held that way to each of them too: the baseline
  given more room may use it.
  ``--lr_frontier`` adds points at other learning rates (chosen KL setting kept), labelled "fixed 0.1, lr 1e-05":
  a method whose KL no penalty moves (its step size holds it) gets points further out, and the choices on
  validation above choose among them too. ``--frontier_methods`` gives frontier runs to some methods only (e.g. the
  information-matched pair), so the report does not list the others' points as missing. ``--frontier_points
  text2grad:3.33e-06:3`` adds a point with both knobs moved (labelled "fixed 3, lr 3.33e-06"), for the named
  method only: where neither knob alone brings a method down to a baseline's KL. ``text2grad:3e-04:0.1@2`` runs
  (and reports) the point on task instance 2 only: a step past one instance's grid edge; ``learned/scalar_sum:1e-4:3``
  runs it in the learned arm only: a step past one arm's edge.
- ``ablation``: the quickstart's learned-arm Text2Grad setting with one change each (reward scale, whitening, value
  strength, entropy, clip range, oracle critic), to find what drives its late collapse.
- ``report``: ``study.json`` (everything, each run's validation curve and CPU included, and each Text2Grad method
  against its information-matched baseline: ``matched``), ``study.md`` (tables and
  sentences generated from the numbers), ``curves.png`` (test fact score per method, mean and 95 % band over seeds)
  and ``frontier.png`` (final score against final KL). Alone, it trains nothing and reports what has finished.

``--export_to`` copies every finished run's ``result.json`` and the reports out (to commit them); ``--resume_from``
copies such files into a fresh ``--output_dir``, so another machine resumes the study instead of starting over. The
setup is rebuilt there, and another kind of CPU, or another torch thread count, trains a different tiny SFT policy
from the same seed (SmolLM2's LoRA SFT came out the same): the SFT policy trains on ``--sft_threads`` (1), and a
study stops before adding runs that would start from another policy than its finished runs did.

The test split is never read by the sweep or by early stopping: it is scored only in the final and ablation phases.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import transformers
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the critic "benchmarks.baselines:DenseFactCritic" is imported by name
    sys.path.insert(0, str(ROOT))

from benchmarks.baselines import preference_pairs  # noqa: E402
from policy_optimization.checkpoints import STATE_FILE  # noqa: E402
from policy_optimization.ppo_config import PPOConfig  # noqa: E402
from policy_optimization.train import build_trainer  # noqa: E402
from text2grad.apps.quickstart import pipeline as qs  # noqa: E402
from text2grad.apps.quickstart.presets import resolve  # noqa: E402
from text2grad.apps.quickstart.quickstart_config import SMOLLM2, QuickstartConfig  # noqa: E402
from text2grad.apps.quickstart.report import token_logprobs  # noqa: E402
from text2grad.apps.quickstart.results import cpu_name, policy_prompts  # noqa: E402
from text2grad.apps.quickstart.task import critique_summary, fact_accuracy  # noqa: E402
from text2grad.core.data import iter_jsonl, write_jsonl, write_whole  # noqa: E402
from text2grad.core.generation import generate  # noqa: E402
from text2grad.core.modeling import is_adapter_only, load_causal_lm, load_tokenizer, merge_adapter_folder  # noqa: E402
from text2grad.core.spans import decode_with_offsets, feedback_token_labels  # noqa: E402
from text2grad.core.vllm_engine import close_shared_engine  # noqa: E402

from benchmarks.method_study_report import (  # noqa: E402
    ARMS, CRITIC_FREE, DEFENCE_CONTROLS, KL_COEFS, LABELS, LAMBDAS, METHODS, REWARD_MODE,
    SCALAR_METHODS, Setting, choose, control_lines, edge_lines, end_score, early_stopped, frontier_plot, grid_position,
    frontier_dominance_lines, kl_baselines, kl_matched_lines, matched_baseline, matched_comparisons,
    kl_on_validation_lines, markdown, matched_on_validation, mean_ci95, method_label, paper_comparison, plot,
    pooled_lines, pooled_markdown, summarize_ablations, summarize_final, summarize_frontier,
)


# One change each to the quickstart's learned-arm Text2Grad setting (PPOConfig fields, or the critic).
ABLATIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "span_normalize": {"span_normalize": True},  # reward scale: every span worth +-1 in total, not +-1 per token
    "whiten_rewards": {"whiten_rewards": True},  # reward scale: total token rewards scaled to unit variance
    "no_advantage_whitening": {"whiten_advantages": False},
    "strong_value": {"vf_coef": 1.0},  # value head trained 10x harder (its error feeds every advantage)
    "entropy_bonus": {"entropy_coef": 0.01},
    "cliprange_0.1": {"cliprange": 0.1},
    "oracle_critic": {"_arm": "oracle"},  # the same setting with the critic itself: reward-model exploitation
}


@dataclass(frozen=True)
class RunSpec:
    arm: str
    method: str
    setting: Setting
    seed: int
    phase: str  # sweep | final | ablation
    ablation: str = "none"

    @property
    def run_id(self) -> str:
        s = self.setting
        abl = "" if self.ablation == "none" else f"-abl_{self.ablation}"
        return f"{self.phase}/{self.arm}-{self.method}-lr{s.lr:g}-kl_{s.kl_tag}-lam{s.lam:g}{abl}-seed{self.seed}"


@dataclass
class StudyContext:
    """What every run needs, built once by the parent (paths are strings so it pickles to worker processes)."""

    sft: str
    rl: str
    val_records: list[dict[str, Any]]
    test_records: list[dict[str, Any]]
    rm: str
    dense_rm: str
    scalar_rm: str
    iterations: int
    eval_every: int
    batch_size: int
    response_length: int
    kl_coef: float
    target_kl: float
    out: str
    kl_horizon: int = 10  # the adaptive controller's horizon, in iterations
    rm_ensemble: str = ""  # the reward-model ensemble (member-<k>/) of the ensemble variants
    rm_replay: str = ""  # the reward model's training annotations, replayed by the refresh variants
    rm_offline_matched: str = ""  # the reward model of the offline_matched variant (the refresh's control)
    rm_steps_matched: str = ""  # the reward model of the steps_matched variant (the control's extra steps alone)
    rm_swap_matched: str = ""  # the reward model of the swap_matched variant (the control's extra samples' kind alone)
    rm_prompts_matched: str = ""  # the reward model of the prompts_matched variant (the control's RL prompts alone)
    rm_rl_covered: str = ""  # the reward model of the rl_covered variant (every RL post annotated, nothing added)
    sft_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> scores
    start_fingerprint: str = ""  # `weights_fingerprint` of the SFT policy, recorded in every run's result
    sft_threads: int = 0  # the torch threads the SFT policy trained with (--sft_threads), recorded likewise
    use_chat_template: bool = False  # the policy's prompts through its tokenizer's chat template (SmolLM2)
    ppo_fields: dict[str, Any] = field(default_factory=dict)  # the preset's PPOConfig fields (SmolLM2: LoRA)
    checkpoint_runs: bool = False  # checkpoint each run at its evaluation points, so a killed run resumes there


# The SFT policy trains on one torch thread: its numbers then depend on the CPU's kernels alone, not on the
# machine's core count or on what the process ran before (`build_context`).
DEFAULT_SFT_THREADS = 1
REFRESHES_PER_RUN = 6  # on-policy reward-model refreshes over a run (every 15 iterations of 90, every 8 of 48)
ENSEMBLE_SIZE = 3


def _rm_critic_kwargs(path: str, ctx: StudyContext) -> dict[str, Any]:
    """The generative reward model as PPO's critic; with the vLLM backend its critiques go through the policy's
    engine (the policy's tokenizer, PPO's engine settings), as the quickstart does."""
    kwargs: dict[str, Any] = {"path": path, "max_new_tokens": 128, "batch_size": 64, "grounded_spans": True}
    if ctx.ppo_fields.get("generation_backend") == "vllm":
        defaults = PPOConfig()
        kwargs.update(backend="vllm", tokenizer_name_or_path=ctx.sft,
                      vllm_kwargs={"gpu_memory_utilization": defaults.vllm_gpu_memory_utilization,
                                   "cpu_kv_cache_gb": defaults.vllm_cpu_kv_cache_gb})
    return kwargs


def _ensemble(ctx: StudyContext) -> dict[str, Any]:
    """K reward models trained on bootstrap resamples of the annotations; a token is +1 only where all K call it
    good, -1 where any calls it poor (Coste et al. 2023: conservative ensembles resist over-optimisation)."""
    return {"critic": "reward_model_ensemble", "critic_kwargs": _rm_critic_kwargs(ctx.rm_ensemble, ctx),
            "ensemble_aggregation": "vote"}


def refresh_every(iterations: int) -> int:
    """Iterations between refreshes: `REFRESHES_PER_RUN` of them spread over a run of ``iterations``."""
    return max(1, iterations // REFRESHES_PER_RUN)


def _refresh(ctx: StudyContext) -> dict[str, Any]:
    """Every `refresh_every` iterations the task's critic (the annotator the reward model learned from) labels the
    iteration's rollouts and the reward model is fine-tuned on them with its own training annotations replayed (a
    reward model behind vLLM: a copy of its adapter, `policy_optimization.rm_refresh`)."""
    return {"rm_refresh_every": refresh_every(ctx.iterations),
            "rm_refresh_critic": "text2grad.apps.quickstart.task:FactCritic",
            "rm_refresh_critic_kwargs": {"data_path": ctx.rl}, "rm_refresh_replay": [ctx.rm_replay]}


def refresh_budget(iterations: int, batch_size: int, every: int | None = None,
                   steps_per_refresh: int = PPOConfig().rm_refresh_steps) -> tuple[int, int]:
    """(annotations, optimizer steps) the ``refresh`` variant adds to the reward model over a run: each of its
    ``iterations // every`` refreshes (default ``every``: `refresh_every`) annotates the iteration's whole batch
    (rm_refresh_samples' default) and fine-tunes for ``steps_per_refresh`` steps."""
    refreshes = iterations // (every or refresh_every(iterations))
    return refreshes * batch_size, refreshes * steps_per_refresh


def _offline_matched(ctx: StudyContext) -> dict[str, Any]:
    """The refresh's equal-annotation control: no refresh, but a reward model trained offline on as many more
    annotations, for as many more steps, as the refresh adds over the run (`refresh_budget`); the extra annotations are
    the SFT policy's samples on the RL prompts, the prompts the refresh annotates. What is left of the refresh's gain
    over this is the on-policy sampling of its annotations."""
    return {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.rm_offline_matched, ctx)}


def _steps_matched(ctx: StudyContext) -> dict[str, Any]:
    """The equal-annotation control's extra steps alone: a reward model trained on the base annotations only, for as
    many more steps as the refresh adds (`refresh_budget`). offline_matched against this is what the extra
    annotations add at equal steps; this against plain Text2Grad is what the steps add."""
    return {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.rm_steps_matched, ctx)}


def _swap_matched(ctx: StudyContext) -> dict[str, Any]:
    """The equal-annotation control's extra samples by their kind alone: its SFT-policy samples on the RL prompts in
    place of as many noisy summaries, for as many more steps, so the reward model trains on as many annotations as the
    base one. offline_matched against this is what the samples add by their number; this against steps_matched is
    what they add by their kind."""
    return {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.rm_swap_matched, ctx)}


def _prompts_matched(ctx: StudyContext) -> dict[str, Any]:
    """swap_matched with noisy summaries of the same RL posts in place of the SFT policy's samples: the reward model
    has seen the prompts PPO trains on, but not the start policy's own mistakes there. swap_matched against this is
    what the policy's samples add over covering their prompts; this against steps_matched is what the coverage adds."""
    return {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.rm_prompts_matched, ctx)}


def _rl_covered(ctx: StudyContext) -> dict[str, Any]:
    """prompts_matched carried to every RL post and nothing added: a noisy summary of each post PPO trains on, in place
    of as many of the training posts', for the base reward model's steps. Against plain Text2Grad this is what the
    choice of posts to annotate does, at equal annotations and steps."""
    return {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.rm_rl_covered, ctx)}


# The methods a variant can be added to: Text2Grad and its information-matched baseline.
VARIANT_METHODS = ("text2grad", "scalar_sum")

# Variants of a learned-arm method: PPOConfig fields (from the study's context) changed on top of its chosen setting,
# here the defences against reward-model exploitation; a variant runs as its own method "<method>+<variant>" through
# the sweep and final phases.
VARIANTS: dict[str, Callable[[StudyContext], dict[str, Any]]] = {
    "ensemble": _ensemble,
    "refresh": _refresh,
    "ensemble_refresh": lambda ctx: {**_ensemble(ctx), **_refresh(ctx)},
    "offline_matched": _offline_matched,
    "steps_matched": _steps_matched,
    "swap_matched": _swap_matched,
    "prompts_matched": _prompts_matched,
    "rl_covered": _rl_covered,
}
ENSEMBLE_VARIANTS = ("ensemble", "ensemble_refresh")


def split_method(name: str) -> tuple[str, str]:
    """("text2grad", "ensemble") for "text2grad+ensemble"; ("text2grad", "") for a plain method."""
    method, _, variant = name.partition("+")
    if method not in METHODS or (variant and variant not in VARIANTS):
        raise ValueError(f"unknown method {name!r}: methods are {', '.join(METHODS)}, optionally +<variant> with "
                         f"variants {', '.join(VARIANTS) or '(none defined)'}")
    return method, variant


def cpu_model() -> str:
    """The CPU's model name, with the cores this process may use."""
    return f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores"


def cpu_load() -> float | None:
    """The machine's 1-minute load average (None where the OS has none): recorded at each evaluation point, so that a
    run's seconds can be read against how many processes shared its cores."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def cpu_kernels() -> str:
    """The vector instructions torch's CPU kernels use here, e.g. "AVX512 + AMX". Two virtual CPUs of one model
    name ("Intel(R) Xeon(R) Processor") can differ in them, and so in the SFT policy the same seed trains."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()  # private in torch 2.x: absent is "no"
    return torch.backends.cpu.get_cpu_capability() + (" + AMX" if amx else "")


def cpu_id() -> str:
    """The CPU's family, model and stepping numbers (x86 /proc/cpuinfo), e.g. "family 6 model 143 stepping 8": a
    virtual CPU's model name can be as generic as "Intel(R) Xeon(R) Processor". "" where they are not exposed."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
    except OSError:
        return ""
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return " ".join(f"{k.split()[-1]} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short sha256 of every parameter and buffer (names sorted, exact bytes): two start policies with the same
    fingerprint are the same policy, while equal validation scores only say their greedy outputs agree there."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# One run (in a worker process)
# --------------------------------------------------------------------------------------------------


def _ppo_config(ctx: StudyContext, spec: RunSpec, run_dir: Path):

    overrides = dict(ABLATIONS[spec.ablation])
    arm = overrides.pop("_arm", spec.arm)
    method, variant = split_method(spec.method)
    overrides.update(VARIANTS[variant](ctx) if variant else {})
    s = spec.setting
    critic: dict[str, Any]
    if method == "scalar_bt":
        critic = {"critic": "none", "scalar_source": "scalar_rm", "scalar_source_kwargs": {"path": ctx.scalar_rm}}
    elif method == "scalar_task":
        critic = {"critic": "none", "scalar_source": "text2grad.apps.quickstart.task:FactScore",
                  "scalar_source_kwargs": {"data_path": ctx.rl}}
    elif arm == "oracle":
        name = "benchmarks.baselines:DenseFactCritic" if method == "dense" else "text2grad.apps.quickstart.task:FactCritic"
        critic = {"critic": name, "critic_kwargs": {"data_path": ctx.rl}}
    else:
        critic = {"critic": "reward_model", "critic_kwargs": _rm_critic_kwargs(ctx.dense_rm if method == "dense" else ctx.rm, ctx)}
    fields = dict(
        model_name_or_path=ctx.sft, dataset_path=ctx.rl, prompt_template="{prompt}", reward_mode=REWARD_MODE[method],
        use_lora=False, output_dir=str(run_dir), overwrite_output_dir=True, batch_size=ctx.batch_size,
        num_mini_batches=2, num_ppo_epochs=2, learning_rate=s.lr, lr_scheduler_type="constant",
        kl_coef=s.kl_coef if s.kl_coef is not None else 0.2 if s.kl == "adaptive" else ctx.kl_coef,
        adaptive_kl=s.kl == "adaptive", target_kl=ctx.target_kl,
        # the controller's horizon in this run's iterations (PPOConfig's default: 10), so its target binds in the run
        kl_horizon=ctx.kl_horizon, kl_horizon_unit="iterations", lam=s.lam, response_length=ctx.response_length, temperature=0.7,
        vf_coef=0.1, save_steps=0, save_total_limit=1, occurrence="first", seed=spec.seed, log_samples=0,
        # a sample without feedback scores zero and is counted (samples/source_error in the metrics)
        max_feedback_error_rate=1.0, num_iterations=ctx.iterations, progress_bar=False,
        use_chat_template=ctx.use_chat_template, **critic,
    )
    return PPOConfig(**{**fields, **ctx.ppo_fields, **overrides})  # an ablation's change replaces the study's value


def _greedy(model, tokenizer, records: Sequence[Mapping[str, Any]], max_new_tokens: int, use_chat_template: bool = False):
    """Fact scores of the greedy summaries of ``records`` (prompts rendered as PPO renders them), and the generations."""
    was_training = model.training
    model.eval()
    prompts, add_special = policy_prompts(tokenizer, [r["prompt"] for r in records], use_chat_template)
    gens = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=64, do_sample=False,
                    add_special_tokens=add_special)
    model.train(was_training)
    return dict(fact_accuracy(records, [g.text for g in gens])), gens


def true_label_shift(model, sft_model, tokenizer, records, sft_gens) -> dict[str, dict[str, float]]:
    """Mean log-prob change (policy minus SFT) of the SFT policy's greedy test summaries' tokens, grouped by the
    TRUE critic's labels (`critique_summary`): good, poor (first token of a poor quote / inside it), unlabelled."""

    sums: dict[str, list[float]] = {}
    for rec, gen in zip(records, sft_gens):
        ids = list(gen.response_ids)
        if not ids:
            continue
        text, offsets = decode_with_offsets(tokenizer, ids)
        labels = feedback_token_labels(critique_summary(rec["facts"], gen.text), text, offsets, occurrence="first").labels
        before = token_logprobs(sft_model, gen.prompt_ids, ids)
        after = token_logprobs(model, gen.prompt_ids, ids)
        prev = 0
        for lab, b, a in zip(labels, before, after):
            key = "neutral" if lab == 0 else ("good" if lab > 0 else ("poor_first" if lab != prev else "poor_inside"))
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += a - b
            acc[1] += 1
            prev = lab
    return {k: {"mean": v[0] / v[1], "n": v[1]} for k, v in sums.items()}


PARTIAL_FILE = "partial.json"  # a checkpointed run's curve so far and the checkpoint it resumes from


def read_partial(run_dir: Path) -> dict[str, Any] | None:
    """The progress a killed checkpointed run left (`PARTIAL_FILE`), or None when there is none to resume: no file,
    or its checkpoint is gone (the run then starts over, and says why)."""
    path = run_dir / PARTIAL_FILE
    if not path.is_file():
        return None
    partial = json.loads(path.read_text())
    if not (Path(partial["checkpoint"]) / STATE_FILE).is_file():
        print(f"[study] {run_dir}: {partial['checkpoint']} is gone, so the run starts over")
        return None
    return partial


def run_one(ctx: StudyContext, spec: RunSpec) -> dict[str, Any]:
    """Train one (arm, method, setting, seed) and evaluate it every ``eval_every`` iterations; returns the result
    (also written to ``<out>/<run_id>/result.json``). With ``ctx.checkpoint_runs`` the run saves a checkpoint and
    its curve so far (`PARTIAL_FILE`) at each evaluation point before the last, and a run killed later resumes from
    there (the PPO trainer's own resume: weights, optimizer, RNG and data order)."""

    torch.set_num_threads(1)  # decoding-bound on a tiny model: one thread per run, runs side by side
    run_dir = Path(ctx.out) / spec.run_id
    t0 = time.perf_counter()
    partial = read_partial(run_dir) if ctx.checkpoint_runs else None
    cfg = _ppo_config(ctx, spec, run_dir / "ppo")
    if ctx.checkpoint_runs:  # the two newest kept: the one the partial file names survives a kill between the writes
        cfg = replace(cfg, save_total_limit=2, resume=partial["checkpoint"] if partial else None)
    trainer = build_trainer(cfg)
    trainer.start_run()
    score_test = spec.phase != "sweep"
    curve = [{"iteration": 0, "val": ctx.sft_scores["val"], **({"test": ctx.sft_scores["test"]} if score_test else {})}]
    metrics: list[dict[str, Any]] = []
    loads: list[float | None] = []
    seconds_before = 0.0
    if partial:
        curve, metrics, seconds_before = partial["curve"], partial["metrics"], partial["seconds"]
        loads = partial.get("load_1min", [])
        print(f"[study] {spec.run_id}: resumed at iteration {trainer.state.step} of {ctx.iterations}")
    for it in range(trainer.state.step + 1, ctx.iterations + 1):
        m = trainer.step()
        metrics.append({k: m.get(k) for k in ("iteration", "reward/score_mean", "objective/kl", "objective/kl_coef",
                                              "policy/rollout_entropy", "policy/clipfrac", "val/explained_variance",
                                              "samples/source_error", "tokens/labelled_share", "response/length_mean")
                        if k in m})
        if it % ctx.eval_every == 0 or it == ctx.iterations:
            point: dict[str, Any] = {"iteration": it, "kl": m.get("objective/kl"),
                                     "val": _greedy(trainer.policy, trainer.tokenizer, ctx.val_records, ctx.response_length,
                                                   ctx.use_chat_template)[0]}
            if score_test:
                point["test"] = _greedy(trainer.policy, trainer.tokenizer, ctx.test_records, ctx.response_length,
                                        ctx.use_chat_template)[0]
            curve.append(point)
            loads.append(cpu_load())
            if ctx.checkpoint_runs and it < ctx.iterations:
                checkpoint = trainer.save_checkpoint()
                _write_json(run_dir / PARTIAL_FILE, {"checkpoint": str(checkpoint), "curve": curve, "metrics": metrics,
                                                     "seconds": seconds_before + time.perf_counter() - t0,
                                                     "load_1min": loads})
    result: dict[str, Any] = {"spec": {**asdict(spec), "run_id": spec.run_id}, "curve": curve, "metrics": metrics,
                              "final": curve[-1], "seconds": seconds_before + time.perf_counter() - t0, "cpu": cpu_model(),
                              "cpu_kernels": cpu_kernels(), "cpu_id": cpu_id(), "load_1min": loads,
                              "start_fingerprint": ctx.start_fingerprint, "sft_threads": ctx.sft_threads,
                              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                              "date": time.strftime("%Y-%m-%d")}
    if score_test:
        sft_model = load_causal_lm(ctx.sft).eval()
        _, sft_gens = _greedy(sft_model, trainer.tokenizer, ctx.test_records, ctx.response_length, ctx.use_chat_template)
        trainer.policy.eval()
        result["true_label_shift"] = true_label_shift(trainer.policy, sft_model, trainer.tokenizer, ctx.test_records, sft_gens)
        result["early_stopped"] = early_stopped(curve)
    close = getattr(trainer.critic, "close", None)
    if callable(close):
        close()
    _write_json(run_dir / "result.json", result)
    if ctx.checkpoint_runs:  # finished: its checkpoints are no longer needed (the result is what the study reads)
        (run_dir / PARTIAL_FILE).unlink(missing_ok=True)
        for checkpoint in (run_dir / "ppo").glob("checkpoint-*"):
            shutil.rmtree(checkpoint, ignore_errors=True)
    return result


def _write_json(path: Path, obj: Any) -> None:
    write_whole(path, json.dumps(obj, indent=1, default=str))


def _load_result(ctx: StudyContext, spec: RunSpec) -> dict[str, Any] | None:
    path = Path(ctx.out) / spec.run_id / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


RESULT_FILES = ("result.json",)  # what a finished run leaves that the study reads back (checkpoints are not needed)
REPORT_FILES = ("study.json", "study.md", "curves.png", "frontier.png")


def copy_results(src: Path, dst: Path, reports: bool = False) -> int:
    """Copy every finished run's small result files (`RESULT_FILES`, same relative path) and every folder's
    study.json from ``src`` to ``dst``, keeping files ``dst`` already has; with ``reports`` every report file
    (`REPORT_FILES`), replacing ``dst``'s. Used both ways: to commit a study's runs (``--export_to``) and to resume
    it elsewhere from them (``--resume_from``), since a run whose result.json is in place is not run again, and a
    study.json keeps what only the earlier machine recorded (its identity, which the resume is checked against, its
    critics' quality, its sweep). Returns the number of files copied."""
    names = RESULT_FILES + (REPORT_FILES if reports else ("study.json",))
    copied = 0
    for path in sorted(p for name in names for p in Path(src).rglob(name)):
        rel = path.relative_to(src)
        if rel.parts[0] == "shared":  # the setup's cache (data, models) is rebuilt, never copied
            continue
        target = Path(dst) / rel
        if target.exists() and not (reports and path.name in REPORT_FILES):
            continue
        write_whole(target, path.read_bytes())  # whole: processes resuming side by side copy the same files
        copied += 1
    return copied


def init_run_worker(parent_pid: int) -> None:
    """Run in each worker. On Linux, the kernel sends it SIGTERM when the study's process dies, so a killed study
    leaves no run going on that would later write its result into the folder (a resumed or renamed study would read
    it as its own). And the vLLM engine its runs share (``--generation_backend vllm``: kept up for the worker's next
    run) is stopped before the worker exits: multiprocessing joins a process's children at exit, and vLLM's
    engine-core process runs until it is told to stop, so the worker would never exit and the study would wait on
    it forever after its last run. A finalizer with an exit priority runs before that join."""
    mp_util.Finalize(None, close_shared_engine, exitpriority=10)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def run_all(ctx: StudyContext, specs: Sequence[RunSpec], jobs: int, train: bool = True) -> dict[RunSpec, dict[str, Any]]:
    """Every spec's result: loaded when already on disk, else trained, ``jobs`` runs at a time (a failed run is
    reported and left out, never allowed to stop the others); ``train=False`` only loads (a report of a study
    still running)."""

    done = {s: r for s in specs if (r := _load_result(ctx, s)) is not None}
    todo = [s for s in specs if s not in done]
    if not todo or not train:
        return done
    bar = tqdm(total=len(todo), desc=f"runs ({len(done)} already done)", unit="run")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=init_run_worker,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(run_one, ctx, s): s for s in todo}
        for fut in as_completed(futures):
            spec = futures[fut]
            try:
                done[spec] = res = fut.result()
                tail = res["final"]
                tqdm.write(f"[study] {spec.run_id}: val {tail['val']['fact_score']:.3f}"
                           + (f", test {tail['test']['fact_score']:.3f}" if "test" in tail else "")
                           + f", KL {tail.get('kl') or 0:.2f} ({res['seconds']:.0f} s)")
            except Exception as exc:  # noqa: BLE001 - reported, the study goes on
                tqdm.write(f"[study] {spec.run_id} FAILED: {type(exc).__name__}: {exc}")
            bar.update(1)
    bar.close()
    return done


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------


def frontier_specs(keys: Sequence[tuple[str, str]], chosen: Mapping[tuple[str, str], Setting], coefs: Sequence[float],
                   seeds: Sequence[int], default_coef: float, lrs: Sequence[float] = (),
                   points: Sequence[tuple[str, float, float]] = (),
                   point_keys: Sequence[tuple[str, str]] | None = None) -> list[RunSpec]:
    """The frontier phase's runs, on the final seeds: each (arm, method) of ``keys`` at its chosen learning rate and
    lambda with each fixed KL coefficient of ``coefs``, and at its chosen KL setting and lambda with each learning
    rate of ``lrs`` (the step size, not the penalty, can be what holds a method near its start); then each
    two-knob point (method, learning rate, fixed coefficient) of ``points`` for the (arm, method) pairs of
    ``point_keys`` (default ``keys``) with that method (a point named "arm/method": that pair only), its chosen
    lambda kept (at the chosen coefficient it is the same run as that learning rate's ``lrs`` point). A point
    equal to the chosen setting is the final run itself and is not run twice."""
    fixed_coef = _fixed_coef_or(default_coef)
    specs: list[RunSpec] = []

    def add(a: str, m: str, setting: Setting) -> None:
        own = chosen[(a, m)]
        if math.isclose(setting.lr, own.lr, rel_tol=1e-3) and setting.kl == own.kl and (
                own.kl == "adaptive" or math.isclose(fixed_coef(setting), fixed_coef(own))):
            return
        specs.extend(RunSpec(a, m, setting, s, "frontier") for s in seeds)

    for a, m in keys:
        setting = chosen[(a, m)]
        for c in coefs:
            add(a, m, replace(setting, kl="fixed", kl_coef=c))
        for lr in lrs:
            add(a, m, replace(setting, lr=lr))
    for a, m in (keys if point_keys is None else point_keys):
        own = chosen[(a, m)]
        for lr, c in ((lr, c) for method, lr, c in points if method in (m, f"{a}/{m}")):
            # at the chosen coefficient the point is the --lr_frontier run (the same run, not a second one)
            same_coef = own.kl == "fixed" and math.isclose(fixed_coef(own), c)
            add(a, m, replace(own, lr=lr) if same_coef else replace(own, lr=lr, kl="fixed", kl_coef=c))
    return specs


def study_methods(keys: Sequence[tuple[str, str]]) -> list[str]:
    """The methods of the (arm, method) ``keys``, each once, in order (a defended one as "text2grad+refresh")."""
    return list(dict.fromkeys(m for _, m in keys))


def _methods_hint(known: Sequence[str], pronoun: str) -> str:
    """The end of an unknown-method error: the study's methods and where a missing one is named."""
    return (f"this study's methods ({', '.join(known)}); name {pronoun} in --methods (a defence in --variants) too")


def parse_frontier_points(texts: Sequence[str], keys: Sequence[tuple[str, str]],
                          task_seeds: Sequence[int] | None = None) -> list[tuple[str, float, float, tuple[int, ...] | None]]:
    """``--frontier_points`` as (method, learning rate, fixed KL coefficient, task instances): each text is
    METHOD:LR:COEF, e.g. "text2grad:3.33e-06:3" (a defended method as "text2grad+refresh:..."), run on every task
    instance, or METHOD:LR:COEF@SEEDS, e.g. "text2grad:3e-04:0.1@2" or "...@0,1", run on those task instances only
    (a point past one instance's grid edge need not run, nor be reported missing, on the others). ARM/METHOD, e.g.
    "learned/scalar_sum:1e-4:3", runs it in that arm only (a step past one arm's grid edge). Raises ValueError
    naming what is wrong: the form, a number, a method that is none of ``keys``' methods (an arm/method none of
    ``keys``), or an instance that is not among ``task_seeds`` (the study's instances; None: any)."""
    known = study_methods(keys)
    pairs = [f"{a}/{m}" for a, m in keys]
    points = []
    for text in texts:
        point, at, where = text.partition("@")
        method, *numbers = point.split(":")
        try:
            lr, coef = (float(x) for x in numbers)
        except ValueError:
            raise ValueError(f"--frontier_points {text}: expected METHOD:LR:COEF with two numbers, e.g. "
                             "text2grad:3.33e-06:3 (the learning rate, then the fixed KL coefficient)") from None
        if "/" in method and method not in pairs:
            raise ValueError(f"--frontier_points {text}: {method!r} is not among this study's arm/method pairs "
                             f"({', '.join(pairs)}); name the arm in --arms and the method in --methods")
        if "/" not in method and method not in known:
            raise ValueError(f"--frontier_points {text}: {method!r} is not among {_methods_hint(known, 'it')}")
        if not (lr > 0 and coef >= 0):
            raise ValueError(f"--frontier_points {text}: the learning rate must be > 0 and the KL coefficient >= 0")
        only = None
        if at:
            try:
                only = tuple(int(x) for x in where.split(","))
            except ValueError:
                raise ValueError(f"--frontier_points {text}: after '@' expected task instances separated by commas, "
                                 "e.g. text2grad:3e-04:0.1@2 or text2grad:3e-04:0.1@0,1") from None
            if task_seeds is not None and (outside := [t for t in only if t not in task_seeds]):
                raise ValueError(f"--frontier_points {text}: task instance(s) {', '.join(map(str, outside))} not "
                                 f"among this study's ({', '.join(map(str, task_seeds))}); name them in --task_seeds")
        points.append((method, lr, coef, only))
    return points


def points_on_instance(points: Sequence[tuple[str, float, float, tuple[int, ...] | None]],
                       task_seed: int) -> list[tuple[str, float, float]]:
    """The (method, learning rate, fixed coefficient) of the ``--frontier_points`` that run on ``task_seed``."""
    return [(m, lr, c) for m, lr, c, only in points if only is None or task_seed in only]


def method_keys(arms: Sequence[str], methods: Sequence[str], variants: Sequence[str] = (),
                variant_methods: Sequence[str] = VARIANT_METHODS) -> list[tuple[str, str]]:
    """(arm, method) pairs: every method under every arm, but the critic-free ones (`CRITIC_FREE`) once, under
    their own arm (scalar_bt: learned, scalar_task: oracle) and only when that arm is studied; then each variant
    ``method+variant`` of those of ``methods`` in ``variant_methods`` (Text2Grad and the information-matched
    scalar_sum) in the learned arm (the variants are defences of a learned reward model)."""
    keys = [(a, m) for a in arms for m in methods if m not in CRITIC_FREE]
    keys += [(CRITIC_FREE[m], m) for m in methods if m in CRITIC_FREE and CRITIC_FREE[m] in arms]
    keys += [("learned", f"{m}+{v}") for v in variants if "learned" in arms for m in methods if m in variant_methods]
    return keys


def frontier_keys(keys: Sequence[tuple[str, str]], methods: Sequence[str] | None) -> list[tuple[str, str]]:
    """The (arm, method) pairs of ``keys`` that get frontier runs: those whose method (with its variant, e.g.
    "text2grad+refresh") is in ``methods``, or all when ``methods`` is None. A name that is none of the keys'
    methods raises ValueError naming those there are (a typo would silently leave the frontier empty)."""
    if methods is None:
        return list(keys)
    known = study_methods(keys)
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"--frontier_methods {' '.join(unknown)}: not among {_methods_hint(known, 'them')}")
    return [(a, m) for a, m in keys if m in methods]


def extend_grid(tried: Sequence[float], best: float, factor: float, lo: float = 0.0, hi: float = math.inf) -> float | None:
    """The next value to try when ``best`` sits at an edge of the ``tried`` grid: one ``factor`` step beyond that
    edge, or None when ``best`` is interior or the step would leave (lo, hi)."""
    if len(tried) < 2 or min(tried) < best < max(tried):
        return None
    nxt = best * factor if best == max(tried) else best / factor
    return nxt if lo < nxt < hi else None


def sweep(ctx: StudyContext, keys, base: Setting, lrs: Sequence[float], seed: int, jobs: int,
          knobs: Sequence[str] = ("lambda", "lr", "kl"), lambdas: Sequence[float] = LAMBDAS,
          kl_coefs: Sequence[float] = KL_COEFS, extensions: int = 2, train: bool = True) -> dict[str, Any]:
    """Coordinate search per (arm, method) on validation: lambda, then learning rate, then KL control (the
    adaptive controller, and a fixed coefficient from ``kl_coefs``); ``knobs`` leaves stages out (a left-out knob
    stays at the base setting). Where the learning rate or the fixed coefficient chosen sits at an edge of the
    values tried, the grid grows by a factor of 3 beyond it, up to ``extensions`` times, so the choice ends
    interior where it can (lambda lives in [0, 1]: its edges are the range's)."""
    def spec(a, m, s):
        return RunSpec(a, m, s, seed, "sweep")

    def crit(results, a, m, settings):
        return {s: end_score(results[spec(a, m, s)]["curve"]) for s in settings if spec(a, m, s) in results}

    def stage(candidates: Mapping[tuple[str, str], list[Setting]], key_of, lo=0.0, hi=math.inf):
        """Run the candidates, then extend each key's grid (``key_of``: the swept value of a setting) while its best
        sits at an edge; returns (every setting tried per key, the best per key)."""
        tried = {k: list(v) for k, v in candidates.items()}
        res.update(run_all(ctx, [spec(a, m, x) for (a, m), ss in tried.items() for x in ss], jobs, train))
        for _ in range(extensions):
            more = {}
            for (a, m), ss in tried.items():
                c = crit(res, a, m, ss)
                best = choose(c) if c else ss[0]
                grid = [key_of(x) for x in ss if key_of(x) is not None]
                nxt = extend_grid(grid, key_of(best), 3.0, lo, hi) if key_of(best) is not None else None
                if nxt is not None:
                    more[(a, m)] = replace(best, **({"lr": nxt} if key_of is _lr else {"kl_coef": nxt}))
            if not more:
                break
            res.update(run_all(ctx, [spec(a, m, x) for (a, m), x in more.items()], jobs, train))
            for k, x in more.items():
                tried[k].append(x)
        best = {}
        for (a, m), ss in tried.items():
            c = crit(res, a, m, ss)
            best[(a, m)] = choose(c) if c else ss[0]
        return tried, best

    res: dict[RunSpec, dict[str, Any]] = {}
    lams = (base.lam, *[x for x in lambdas if x != base.lam]) if "lambda" in knobs else (base.lam,)
    stage1, best1 = stage({k: [replace(base, lam=lam) for lam in lams] for k in keys}, lambda x: None)
    if "lr" in knobs:
        stage2, best2 = stage({k: [b] + [replace(b, lr=lr) for lr in lrs if lr != b.lr] for k, b in best1.items()}, _lr)
    else:
        stage2, best2 = {k: [b] for k, b in best1.items()}, best1
    stage3: dict[tuple[str, str], list[Setting]] = {k: [b] for k, b in best2.items()}
    best3 = best2
    if "kl" in knobs:
        cands = {}
        for k, b in best2.items():
            fixed_base = replace(b, kl="fixed", kl_coef=None)
            coefs = [c for c in kl_coefs if not math.isclose(c, ctx.kl_coef if ctx else -1.0)]
            cands[k] = [b, replace(b, kl="adaptive", kl_coef=None)] + [replace(fixed_base, kl_coef=c) for c in coefs]
        stage3, best3 = stage(cands, _fixed_coef(ctx))
    table: dict[str, Any] = {}
    for (a, m) in keys:
        settings = list(dict.fromkeys([*stage1[(a, m)], *stage2[(a, m)], *stage3[(a, m)]]))
        tried = crit(res, a, m, settings)
        chosen = best3[(a, m)]
        lr_grid = sorted({x.lr for x in stage2[(a, m)]})
        kl_grid = sorted({c for x in stage3[(a, m)] if (c := _fixed_coef(ctx)(x)) is not None})
        table[f"{a}/{m}"] = {
            "chosen": asdict(chosen), "knobs": list(knobs),
            "tried": [{"setting": asdict(x), "val_end": v} for x, v in tried.items()],
            # where each chosen value sits in the grid it was chosen from (the report says when at an edge)
            "edges": {"lambda": grid_position(sorted({x.lam for x in stage1[(a, m)]}), best1[(a, m)].lam),
                      "lr": grid_position(lr_grid, best2[(a, m)].lr),
                      **({"kl_coef": grid_position(kl_grid, _fixed_coef(ctx)(chosen))}
                         if chosen.kl == "fixed" and len(kl_grid) > 1 else {})},
        }
    return table


def _lr(x: Setting) -> float:
    return x.lr


def _fixed_coef(ctx: StudyContext | None):
    """A setting's fixed KL coefficient (the preset's where it names none), None for the adaptive controller."""
    return _fixed_coef_or(ctx.kl_coef if ctx is not None else None)


def _fixed_coef_or(default: float | None):
    def coef(x: Setting) -> float | None:
        return None if x.kl != "fixed" else (x.kl_coef if x.kl_coef is not None else default)
    return coef


def runs_not_finished(specs: Sequence[RunSpec], default_coef: float,
                      chosen: Mapping[tuple[str, str], Setting] | None = None) -> dict[str, dict[str, list[int]]]:
    """The seeds of ``specs`` (runs without a result) by (arm/method) and KL setting, labelled as the report labels
    frontier points: "fixed 0.3" (the preset's ``default_coef`` where a setting names none), and with ", lr 1e-05"
    for a learning rate other than the ``chosen`` setting's."""
    out: dict[str, dict[str, list[int]]] = {}
    for s in specs:
        label = "adaptive" if s.setting.kl == "adaptive" else (
            f"fixed {default_coef if s.setting.kl_coef is None else s.setting.kl_coef:g}")
        own = (chosen or {}).get((s.arm, s.method))
        if own is not None and not math.isclose(s.setting.lr, own.lr, rel_tol=1e-3):
            label += f", lr {s.setting.lr:.3g}"
        out.setdefault(f"{s.arm}/{s.method}", {}).setdefault(label, []).append(s.seed)
    return out


def chosen_settings(sweep_table: Mapping[str, Any], keys, base: Setting) -> dict[tuple[str, str], Setting]:
    return {(a, m): Setting(**sweep_table[f"{a}/{m}"]["chosen"]) if f"{a}/{m}" in sweep_table else base for a, m in keys}


def inherited_sweep(stored: Mapping[str, Any], task_seed: int, path: str) -> dict[str, Any]:
    """The sweep table ``--settings_from`` gives task instance ``task_seed``: a one-instance study's sweep serves
    every instance; a study over several instances (its study.json has ``instances``) gives each instance the sweep
    made on that instance, so that each is tuned on its own validation split. An instance it did not sweep is an
    error naming the instances it did."""
    if "instances" not in stored:
        return dict(stored.get("sweep", {}))
    swept = {ts: inst["sweep"] for ts, inst in stored["instances"].items() if inst.get("sweep")}
    if str(task_seed) not in swept:
        raise SystemExit(f"--settings_from {path}: it swept task instance(s) {', '.join(swept) or 'none'}, not "
                         f"{task_seed}; sweep that instance there first (--phases sweep --task_seeds {task_seed}) or "
                         f"leave it out of --task_seeds")
    return dict(swept[str(task_seed)])


def inherited_settings(sweep_table: Mapping[str, Any], keys) -> dict[str, str | None]:
    """For ``--settings_from``: which row of another study's sweep each (arm, method) takes its setting from: its
    own, else its method's for a variant ``m+v`` (the defence changes the critic, not the optimiser), else
    scalar_collapsed's for scalar_sum (the same reward placement at the last token); None: the base setting."""
    rows: dict[str, str | None] = {}
    for a, m in keys:
        method = split_method(m)[0]
        candidates = (m, method, "scalar_collapsed" if method == "scalar_sum" else "")
        rows[f"{a}/{m}"] = next((f"{a}/{c}" for c in candidates if c and f"{a}/{c}" in sweep_table), None)
    return rows


# --------------------------------------------------------------------------------------------------
# Setup and main
# --------------------------------------------------------------------------------------------------


# The SmolLM2 study's start: LoRA SFT on the task (the paper's order: SFT, then the reward model, then PPO), and the
# PPO policy as a LoRA adapter on the merged SFT weights (PPO's reference is that merged start policy).
SMOLLM2_LORA = ["--use_lora", "true", "--lora_r", "16", "--lora_alpha", "32"]
SMOLLM2_SFT_ARGS = [*SMOLLM2_LORA, "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"]


def study_config(args: argparse.Namespace, shared: Path) -> QuickstartConfig:
    """The quickstart configuration the study builds its task, SFT policy and reward models with. Their cache is the
    quickstart's, in a folder of its own per ``--sft_threads``: the cache key does not hold the thread count, and an
    SFT policy trained on another count is another policy."""
    root = qs._cache_root(QuickstartConfig())  # the quickstart's default cache ($TEXT2GRAD_CACHE or ~/.cache/...)
    base = dict(output_dir=str(shared), seed=args.task_seed, modes=["nl_gradient"], early_stopping=True,
                cache_dir=str(root / f"study-sft_threads{getattr(args, 'sft_threads', DEFAULT_SFT_THREADS)}"))
    if getattr(args, "rm_annotations", 0):
        base["n_annotations"] = args.rm_annotations
    if args.preset != "smollm2":
        return resolve(QuickstartConfig(preset=args.preset, **base))
    # the quickstart's smollm2 preset starts PPO from SmolLM2 as it is; the study fine-tunes it on the task first
    return resolve(QuickstartConfig(
        preset="smollm2", **base, sft_model="", policy_model=SMOLLM2, sft_steps=args.sft_steps,
        policy_sft_steps=args.sft_steps, sft_learning_rate=args.sft_learning_rate, sft_decay_steps=0,
        n_rl=256, n_eval=100, ppo_batch_size=args.batch_size or 8, sft_args=SMOLLM2_SFT_ARGS))


def scalar_rm_recipe(preset: str, cfg: QuickstartConfig) -> list[str]:
    """How the Bradley-Terry reward model trains. The tiny Llama presets: the whole model, 300 steps of 16 pairs.
    SmolLM2: the generative reward model's own budget and adapter (LoRA r 16; its steps, batch 8, learning rate and
    length), so neither critic of the learned arm is trained for longer than the other (and a full fine-tune of 135M
    parameters, 300 steps of 16 pairs, would take hours of CPU)."""
    if preset != "smollm2":
        return ["--use_lora", "false", "--max_length", "256", "--max_steps", "300", "--learning_rate", "5e-4",
                "--per_device_train_batch_size", "16"]
    return [*SMOLLM2_LORA, "--max_length", "320", "--max_steps", str(cfg.rm_steps), "--learning_rate",
            f"{cfg.rm_learning_rate:g}", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4"]


def preset_ppo_fields(preset: str, generation_backend: str = "hf") -> dict[str, Any]:
    """The preset's own PPOConfig fields: SmolLM2's policy is a LoRA (r 16), the tiny Llama is fully fine-tuned;
    with ``generation_backend`` vllm, rollouts (and the reward model's critiques) go through vLLM."""
    fields: dict[str, Any] = {"use_lora": True, "lora_r": 16, "lora_alpha": 32} if preset == "smollm2" else {}
    return {**fields, **({"generation_backend": "vllm"} if generation_backend == "vllm" else {})}


def build_context(args: argparse.Namespace, keys: Sequence[tuple[str, str]]) -> StudyContext:
    """Data, SFT policy, the reward models ``keys`` need (the generative ones for a learned arm, the Bradley-Terry
    one for scalar_bt; cached like the quickstart's), and the SFT policy's validation and test scores."""

    out = Path(args.output_dir)
    shared = out / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    cfg = study_config(args, shared)
    qs._COMMAND_LOG[:] = [out / "commands.sh"]
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# Every phase command the study's setup ran, in order.\n")
    stages = qs.StageClock(qs.STAGES)
    data = qs.stage_data(cfg, shared)
    # the SFT policy's floating-point sums follow the thread count: fixed, so every task instance of every command
    # trains the same start on a machine of this kind, whatever came before it in the process
    sft_threads = getattr(args, "sft_threads", DEFAULT_SFT_THREADS)
    torch.set_num_threads(sft_threads)
    sft, rm_base = qs.stage_policy(cfg, data)
    if is_adapter_only(sft):  # the LoRA SFT folded in once: every run's start policy, and the reward models' base
        merged = merged_sft_folder(Path(sft))
        rm_base = rm_base if Path(rm_base).resolve() != Path(sft).resolve() else merged
        sft = merge_adapter_folder(sft, merged)
    torch.set_num_threads(1)
    val_records, test_records = list(iter_jsonl(data["val"])), list(iter_jsonl(data["eval"]))
    tok, model = load_tokenizer(str(sft)), load_causal_lm(str(sft)).eval()
    sft_scores = {split: _greedy(model, tok, recs, cfg.response_length, cfg.use_chat_template)[0]
                  for split, recs in (("val", val_records), ("test", test_records))}
    fingerprint = weights_fingerprint(model)
    del model
    check_same_start(out, sft_scores, fingerprint, sft_threads)  # before the reward models: they take the longest to build
    learned = {m for a, m in keys if a == "learned" and m != "scalar_bt"}
    rm = dense_rm = scalar_rm = rm_ensemble = rm_replay = ""
    if learned - {"dense"}:
        rm = str(qs.stage_reward_model(cfg, data, sft, rm_base, shared / "text2grad_rm", stages)[0])
        rm_replay = str(Path(rm).parent / "rm_train.jsonl")
    if any(m.partition("+")[2] in ENSEMBLE_VARIANTS for m in learned):
        ens_cfg = replace(cfg, rm_args=[*cfg.rm_args, "--ensemble_size", str(ENSEMBLE_SIZE), "--bootstrap", "true"])
        try:
            rm_ensemble = str(qs.stage_reward_model(ens_cfg, data, sft, rm_base, shared / "text2grad_rm_ensemble", stages)[0])
        except Exception as exc:  # noqa: BLE001 - the ensemble variants are dropped (and said so), the study goes on
            print(f"[study] the reward-model ensemble could not be trained ({type(exc).__name__}: {exc}); the "
                  f"{', '.join(ENSEMBLE_VARIANTS)} variants are left out")
    # the reward models of the annotation variants: the refresh's controls (its extra annotations and steps offline,
    # its extra steps alone, its extra annotations' kind alone in place of as many noisy summaries, and their prompts
    # alone: noisy summaries of the same posts), and every RL post annotated
    extra, steps = refresh_budget(args.iterations, args.batch_size or cfg.ppo_batch_size)
    annotation_variants = {
        # the extra annotations are start-policy samples on the prompts the refresh annotates (raising n_annotations
        # would add none once the train split is used up: one response per post)
        "offline_matched": (replace(cfg, rm_extra_policy_samples=extra, rm_steps=cfg.rm_steps + steps),
                            f"its offline annotations plus {extra} SFT-policy samples on the RL prompts"),
        "steps_matched": (replace(cfg, rm_steps=cfg.rm_steps + steps), "its offline annotations only"),
        "swap_matched": (replace(cfg, rm_extra_policy_samples=extra, rm_extra_replace_noisy=True,
                                 rm_steps=cfg.rm_steps + steps),
                         f"its offline annotations with {extra} SFT-policy samples on the RL prompts in place of as "
                         "many noisy summaries"),
        "prompts_matched": (replace(cfg, rm_extra_noisy_summaries=extra, rm_extra_replace_noisy=True,
                                    rm_steps=cfg.rm_steps + steps),
                            f"its offline annotations with {extra} noisy summaries of the RL posts in place of as many "
                            "of the training posts'"),
        # not a control of the refresh: the same count and steps as the base reward model, every RL post among them
        "rl_covered": (replace(cfg, rm_extra_noisy_summaries=cfg.n_rl, rm_extra_replace_noisy=True),
                       f"its offline annotations with a noisy summary of each of the {cfg.n_rl} RL posts in place of as "
                       "many of the training posts'"),
    }
    variant_rms = {name: "" for name in annotation_variants}
    for name, (variant_cfg, annotations) in annotation_variants.items():
        if any(m.partition("+")[2] == name for m in learned):
            more = 0 if variant_cfg.rm_extra_replace_noisy else variant_cfg.rm_extra_policy_samples
            print(f"[study] {name}: the reward model on {annotations}, for {variant_cfg.rm_steps} steps ({more} "
                  f"annotations and {variant_cfg.rm_steps - cfg.rm_steps} steps beyond the base reward model's; "
                  f"the refresh adds {extra} and {steps})")
            variant_rms[name] = str(qs.stage_reward_model(variant_cfg, data, sft, rm_base, shared / f"text2grad_rm_{name}",
                                                          stages)[0])
    if "dense" in learned:
        dense_cfg = replace(cfg, critic="benchmarks.baselines:DenseFactCritic")
        dense_rm = str(qs.stage_reward_model(dense_cfg, data, sft, rm_base, shared / "dense_rm", stages)[0])
    stages.finish()
    if any(m == "scalar_bt" for _, m in keys):
        scalar_rm = str(shared / "scalar_rm")
        if not (shared / "scalar_rm" / "eval_pairwise.json").is_file():
            pairs = preference_pairs(list(iter_jsonl(data["train"])), cfg.seed, cfg.rm_p_wrong)
            write_jsonl(shared / "preference_pairs.jsonl", pairs)
            qs._call("reward_model.scalar", [
                "--model_name_or_path", str(rm_base), "--dataset_path", str(shared / "preference_pairs.jsonl"),
                "--eval_fraction", "0.1", "--output_dir", scalar_rm, "--prompt_template", "{prompt}",
                *scalar_rm_recipe(args.preset, cfg), "--logging_steps", "10", "--save_steps", str(10 ** 9),
                "--progress_bar", "false", "--seed", str(cfg.seed),
            ])
    lora = preset_ppo_fields(args.preset, getattr(args, "generation_backend", "hf"))
    ctx = StudyContext(
        sft=str(sft), rl=str(data["rl"]), val_records=val_records,
        test_records=test_records, rm=rm, dense_rm=dense_rm, scalar_rm=scalar_rm,
        iterations=args.iterations, eval_every=args.eval_every, batch_size=args.batch_size or cfg.ppo_batch_size,
        response_length=cfg.response_length, kl_coef=cfg.kl_coef, target_kl=args.target_kl, out=str(out),
        kl_horizon=getattr(args, "kl_horizon", 10),
        use_chat_template=cfg.use_chat_template, ppo_fields=lora, rm_ensemble=rm_ensemble, rm_replay=rm_replay,
        rm_offline_matched=variant_rms["offline_matched"], rm_steps_matched=variant_rms["steps_matched"],
        rm_swap_matched=variant_rms["swap_matched"], rm_prompts_matched=variant_rms["prompts_matched"],
        rm_rl_covered=variant_rms["rl_covered"],
        checkpoint_runs=args.preset == "smollm2" if getattr(args, "checkpoint_runs", None) is None else args.checkpoint_runs,
    )
    ctx.sft_scores, ctx.start_fingerprint, ctx.sft_threads = sft_scores, fingerprint, sft_threads
    return ctx


def critic_quality(shared: Path) -> dict[str, dict[str, float]]:
    """The learned critics' training data and quality on held-out data, read from what their training wrote under the
    study's ``shared`` folder (a critic not trained there is left out): the generative reward model's token-label
    accuracy, good- and poor-token F1 and valid-JSON rate on its held-out annotations (reward_model.evaluate, queried as
    PPO queries it), the Bradley-Terry reward model's pairwise accuracy on its held-out pairs, and how many annotations
    or pairs each trained on."""
    quality: dict[str, dict[str, float]] = {}
    folder = shared / "text2grad_rm" / "reward_model"
    if (folder / "eval" / "report.json").is_file():
        r = json.loads((folder / "eval" / "report.json").read_text())
        # annotations.jsonl holds every annotation, the held-out ones included
        n_train = sum(1 for _ in iter_jsonl(folder / "annotations.jsonl")) - r["n_examples"]
        quality["generative"] = {"n": r["n_examples"], "n_train": n_train, "token_accuracy": r["token_label_accuracy"],
                                 "good_f1": r["token"]["positive"]["f1"], "poor_f1": r["token"]["negative"]["f1"],
                                 "json_validity": r["json_validity_rate"]}
    if (shared / "scalar_rm" / "eval_pairwise.json").is_file():
        r = json.loads((shared / "scalar_rm" / "eval_pairwise.json").read_text())
        trained = json.loads((shared / "scalar_rm" / "train_results.json").read_text())
        quality["bradley_terry"] = {"n": r["pairs"], "n_train": trained["train_pairs"], "pairwise_accuracy": r["accuracy"]}
    return quality


def finished_results(folder: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, result) of every finished run's result.json under ``folder`` (the setup's ``shared/`` left out)."""
    for path in sorted(Path(folder).rglob("result.json")):
        if "shared" not in path.relative_to(folder).parts[:2]:  # <folder>/shared, or an instance's task_seed<N>/shared
            yield path, json.loads(path.read_text())


def machines_of_runs(folder: Path) -> tuple[str, str] | None:
    """Where the finished runs under ``folder`` ran, from the CPU and CPU kernels each recorded: (the machine line,
    e.g. "AMD EPYC, 2 cores, AVX512 (4 runs); Intel Xeon, 2 cores (1 run)", and the CPU names joined for the
    results tables), the most used first. None when no run recorded a CPU. A report made elsewhere must not claim
    its own machine for them, and two CPUs of one name can run other kernels (so train another start policy)."""
    counts = Counter((result.get("cpu"), result.get("cpu_kernels")) for _, result in finished_results(folder))
    counts = Counter({key: n for key, n in counts.items() if key[0] is not None})
    if not counts:
        return None
    ranked = counts.most_common()
    machine = "; ".join(", ".join(x for x in key if x) + f" ({n} run{'s' if n > 1 else ''})" for key, n in ranked)
    return machine + load_words(folder), " + ".join(dict.fromkeys(cpu.rsplit(", ", 1)[0] for (cpu, _), _ in ranked))


def load_words(folder: Path) -> str:
    """"; 1-minute load at the evaluation points of the 3 runs that recorded it: median 2.10, up to 4.35" over the
    finished runs under ``folder`` (`cpu_load`), or "" when none recorded it: run seconds on a shared machine are
    not single-run timings, and this says how shared it was."""
    per_run = [[x for x in r.get("load_1min", []) if x is not None] for _, r in finished_results(folder)]
    per_run = [xs for xs in per_run if xs]
    if not per_run:
        return ""
    every = [x for xs in per_run for x in xs]
    return (f"; 1-minute load at the evaluation points of the {len(per_run)} run{'s' if len(per_run) > 1 else ''} "
            f"that recorded it: median {statistics.median(every):.2f}, up to {max(every):.2f}")


def study_date(folder: Path, stored: str | None) -> str:
    """When the study's numbers were made: the day its newest finished run under ``folder`` ended (runs record it),
    or the ``stored`` date of a study whose runs recorded none, whichever is later; today for a study with neither.
    A report made again later from the same runs (new sentences, say) keeps their date."""
    dates = [d for _, result in finished_results(folder) if (d := result.get("date"))]
    return max([*dates, *([stored] if stored else [])], default=time.strftime("%Y-%m-%d"))


def merged_sft_folder(sft: Path) -> Path:
    """Where a LoRA SFT policy (an adapter-only folder in the quickstart's cache) is folded into its base: beside it
    in that cache, not in the study's folder, because the reward models' cache key holds this path, and a study
    resumed or reported in another folder would otherwise train its reward models again."""
    sft = sft.resolve()
    return sft.with_name(sft.name + "-merged")


def check_same_start(folder: Path, sft_scores: Mapping[str, Mapping[str, float]], fingerprint: str = "",
                     sft_threads: int | None = None) -> None:
    """Refuse to add runs to ``folder`` when its finished runs started from another SFT policy than the one built
    here: its validation scores differ from ``sft_scores`` (split -> scores), or its ``fingerprint``
    (`weights_fingerprint`) from the one a run recorded (runs from before fingerprints have only the scores). The
    setup (data, SFT policy, reward models) is rebuilt on every machine, never copied, and the same seed trains a
    different tiny policy on another CPU, torch build or torch thread count (``sft_threads``, here; the message names
    theirs where the runs recorded it): new runs would be compared with old ones as if they shared a start."""
    mine, others = sft_scores["val"], []

    def differing_scores(start: Mapping[str, float]) -> list[str]:
        return [k for k, v in mine.items() if not math.isclose(start.get(k, math.nan), v, abs_tol=1e-9)]

    for path, result in finished_results(folder):
        start, theirs = result["curve"][0]["val"], result.get("start_fingerprint")
        if (fingerprint and theirs and theirs != fingerprint) or differing_scores(start):
            others.append((path.parent.relative_to(folder), start, result))
    if not others:
        return
    run, start, result = others[0]
    machine = ", ".join(x for x in (result.get("cpu"), result.get("cpu_kernels") or "CPU kernels not recorded",
                                    result.get("cpu_id")) if x)
    if differ := differing_scores(start):
        # every differing score at full precision: two starts can agree to four digits on the fact score alone
        here, there = (", ".join(f"{k} {scores.get(k, math.nan):.6g}" for k in differ) for scores in (mine, start))
        what = f"validation {here}, but {len(others)} finished run(s) there started from one with {there}"
    else:  # the same greedy outputs on validation from other weights
        what = (f"weights fingerprint {fingerprint}, but {len(others)} finished run(s) there started from one with "
                f"{result['start_fingerprint']} (the same validation scores)")
    here_machine = ", ".join(x for x in (cpu_model(), cpu_kernels(), cpu_id()) if x)
    theirs_threads = (f"{result['sft_threads']} torch thread(s)" if result.get("sft_threads") else
                      "threads not recorded: before --sft_threads, a command's first task instance trained on the "
                      "machine's cores, the others on 1")
    here_threads = f", its SFT policy on {sft_threads} torch thread(s)" if sft_threads else ""
    raise SystemExit(
        f"{folder}: the start policy built here has {what} (e.g. {run}). The setup is rebuilt, not copied, and the "
        "same seed trains a different SFT policy on another CPU, torch build or torch thread count, so new runs "
        f"cannot be compared with those. They ran on {machine} with torch "
        f"{result.get('versions', {}).get('torch', '(not recorded)')} (SFT policy: {theirs_threads}); this machine is "
        f"{here_machine} with torch {torch.__version__}{here_threads} (a CPU of the same name can use other vector "
        "instructions). Resume on a machine like theirs with their --sft_threads, or pass a new --output_dir.")


def study_identity(args: argparse.Namespace) -> dict[str, Any]:
    """What a finished run's result depends on besides its RunSpec: runs are resumed by RunSpec alone, so a folder
    must hold one study of one identity."""
    ident = {k: getattr(args, k) for k in ("preset", "task_seed", "iterations", "eval_every", "batch_size", "target_kl")}
    if getattr(args, "kl_horizon", 10) != 10:  # studies before the horizon in iterations stored no such key
        ident["kl_horizon"] = args.kl_horizon
    if args.preset == "smollm2":
        ident.update(sft_steps=args.sft_steps, sft_learning_rate=args.sft_learning_rate)
    if getattr(args, "rm_annotations", 0):  # studies before this option stored no such key
        ident["rm_annotations"] = args.rm_annotations
    return ident


def check_same_study(stored: Mapping[str, Any] | None, current: Mapping[str, Any], folder: str) -> None:
    """Refuse to resume a folder whose runs were made with other settings (their results would be mixed in)."""
    if stored is None:
        return
    diff = {k: (stored.get(k), v) for k, v in current.items() if stored.get(k) != v}
    if diff:
        raise SystemExit(
            f"{folder} holds a study made with other settings ("
            + "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            + "): its finished runs would be reused as if they were this study's. Pass another --output_dir, or the "
            "folder's own settings to continue it.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/method_study")
    parser.add_argument("--phases", nargs="+", default=["sweep", "final", "ablation", "report"],
                        choices=["sweep", "final", "frontier", "ablation", "report"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the final phase")
    parser.add_argument("--sweep_seed", type=int, default=100, help="seed of every sweep run (not one of --seeds)")
    parser.add_argument("--ablation_seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    parser.add_argument("--preset", default="default", choices=["ci", "default", "large", "smollm2"],
                        help="quickstart preset (task, SFT, reward models); smollm2: LoRA SFT of SmolLM2-135M-Instruct "
                        "on the task, then LoRA PPO")
    parser.add_argument("--sft_steps", type=int, default=10,
                        help="smollm2: LoRA SFT steps (batch 16). 10 leave room for PPO (validation fact score 0.34, "
                        "1.5 false facts per summary); 40 already reach 0.94, leaving PPO little to improve")
    parser.add_argument("--sft_learning_rate", type=float, default=1e-3, help="smollm2: LoRA SFT learning rate")
    parser.add_argument("--rm_annotations", type=int, default=0,
                        help="responses annotated for the generative reward model (0: the preset's; smollm2: 160, "
                             "144 of them for training, while the Bradley-Terry model trains on 467 pairs): a study "
                             "of its own (use a new --output_dir)")
    parser.add_argument("--generation_backend", default="hf", choices=["hf", "vllm"],
                        help="PPO rollouts and the reward model's critiques through transformers or vLLM (evaluation "
                        "stays greedy transformers decoding)")
    parser.add_argument("--checkpoint_runs", action=argparse.BooleanOptionalAction, default=None,
                        help="checkpoint each run at its evaluation points, so that a killed study resumes its runs "
                        "there instead of from the start (default: on for --preset smollm2, whose runs take hours)")
    parser.add_argument("--sft_threads", type=int, default=DEFAULT_SFT_THREADS,
                        help="torch threads the setup trains the SFT policy with: the same seed trains another policy "
                             "on another count. A study from before this option trained the first task instance of "
                             "each command with the machine's cores and the others with 1; pass its count to resume it")
    parser.add_argument("--batch_size", type=int, default=0, help="rollouts per PPO iteration (0: the preset's)")
    parser.add_argument("--task_seed", type=int, default=0, help="the task instance (one folder: --output_dir)")
    parser.add_argument("--task_seeds", type=int, nargs="+", default=None,
                        help="several task instances: each gets its own data, SFT start, reward models, sweep and runs "
                        "in <output_dir>/task_seed<N> (resumable), and the report covers each instance and all pooled")
    parser.add_argument("--resume_from", default=None,
                        help="a folder of committed results (e.g. benchmarks/results/method_study_v2/runs): its runs' "
                        "result.json files are copied into --output_dir first, so those runs are not run again")
    parser.add_argument("--export_to", default=None,
                        help="copy every finished run's result.json and the reports into this folder at the end "
                        "(e.g. benchmarks/results/method_study_v2), to commit them")
    parser.add_argument("--variants", nargs="*", default=[], choices=list(VARIANTS),
                        help="variants of text2grad and scalar_sum to add as methods (PPOConfig fields of VARIANTS)")
    parser.add_argument("--variant_methods", nargs="+", default=list(VARIANT_METHODS), choices=list(VARIANT_METHODS),
                        help="which of --methods get the --variants (default both: a defended Text2Grad is compared "
                             "with scalar_sum under the same defence; text2grad alone where that pair is not run)")
    parser.add_argument("--iterations", type=int, default=90, help="PPO iterations per run (x --batch_size rollouts)")
    parser.add_argument("--eval_every", type=int, default=15)
    parser.add_argument("--sweep_knobs", nargs="+", default=["lambda", "lr", "kl"], choices=["lambda", "lr", "kl"],
                        help="which coordinates the sweep searches (the others stay at the base setting)")
    parser.add_argument("--base_lr", type=float, default=1e-4, help="the sweep's starting learning rate")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-5, 3e-4], help="learning rates tried at the best lambda")
    parser.add_argument("--base_lambda", type=float, default=0.95, help="the sweep's starting GAE lambda")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS), help="GAE lambdas the sweep tries")
    parser.add_argument("--target_kl", type=float, default=6.0, help="target of the adaptive KL setting (the paper's: 6 nats)")
    parser.add_argument("--kl_horizon", type=int, default=10, help="the adaptive KL controller's horizon, in iterations")
    parser.add_argument("--kl_coefs", type=float, nargs="+", default=list(KL_COEFS),
                        help="fixed KL coefficients the sweep tries beside the adaptive controller")
    parser.add_argument("--kl_frontier", type=float, nargs="*", default=[],
                        help="phase frontier: every method again with the final seeds at each of these fixed KL "
                             "coefficients (its chosen learning rate and lambda), for the final-score-vs-KL frontier and "
                             "the comparison at matched KL")
    parser.add_argument("--lr_frontier", type=float, nargs="*", default=[],
                        help="phase frontier: every method again with the final seeds at each of these learning rates "
                             "(its chosen KL setting and lambda): points of the same frontier, reached by the step size")
    parser.add_argument("--frontier_points", nargs="+", default=[], metavar="[ARM/]METHOD:LR:COEF[@SEEDS]",
                        help="phase frontier: a method again with the final seeds at this learning rate AND this fixed KL "
                             "coefficient (its chosen lambda), e.g. text2grad:3.33e-06:3: a point that needs both knobs "
                             "moved (a smaller step and a stronger penalty); only the named method runs it; with @SEEDS "
                             "(e.g. @2 or @0,1) only on those task instances; as ARM/METHOD (e.g. "
                             "learned/scalar_sum:1e-4:3) only in that arm")
    parser.add_argument("--frontier_methods", nargs="+", default=None,
                        help="phase frontier: only these of the methods get frontier runs (e.g. text2grad scalar_sum; "
                             "a defended one as text2grad+refresh); default: every method")
    parser.add_argument("--grid_extensions", type=int, default=2,
                        help="times the learning-rate and KL grids grow (x3) past a choice at their edge")
    parser.add_argument("--settings_from", default=None,
                        help="a study.json (e.g. benchmarks/results/method_study/study.json) whose sweep chose the "
                             "settings the final runs use, instead of this study's own sweep: each method takes its "
                             "own row, a variant its method's, scalar_sum scalar_collapsed's (the report says which); "
                             "a study over several task instances gives each instance its own sweep's choices")
    parser.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))), help="runs at a time (one thread each)")
    args = parser.parse_args(argv)
    try:
        keys = method_keys(args.arms, args.methods, args.variants, args.variant_methods)
        frontier_keys(keys, args.frontier_methods)
        args.frontier_points = parse_frontier_points(args.frontier_points, keys,
                                                     args.task_seeds if args.task_seeds else [args.task_seed])
        if args.sft_threads < 1:
            raise ValueError(f"--sft_threads {args.sft_threads}: the SFT policy needs at least 1 torch thread")
    except ValueError as exc:
        parser.error(str(exc))
    command = "python benchmarks/method_study.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.output_dir)
    if args.resume_from:
        print(f"[study] {copy_results(Path(args.resume_from), out)} result files copied from {args.resume_from}")
    if not args.task_seeds:
        run_instance(args, command)
    else:
        studies = {}
        for task_seed in args.task_seeds:
            sub = argparse.Namespace(**{**vars(args), "task_seed": task_seed, "output_dir": str(out / f"task_seed{task_seed}")})
            studies[task_seed] = run_instance(sub, command)
        studies = {ts: st for ts, st in studies.items() if st}  # an instance without a finished run has no report
        if studies:
            write_pooled_report(studies, out, command)
    if args.export_to:
        print(f"[study] {copy_results(out, Path(args.export_to), reports=True)} files copied to {args.export_to}")
    return 0


def write_pooled_report(studies: Mapping[int, Mapping[str, Any]], out: Path, command: str) -> dict[str, Any]:
    """study.json, study.md and frontier.png of a study over several task instances (each instance's own files stay
    in its folder)."""
    pooled: dict[str, Any] = {}

    def add(arm: str, lines: list[str]) -> dict[str, Any]:
        """``lines`` appended to the arm's sentences (a blank line between groups); the arm's entry."""
        entry = pooled.setdefault(arm, {"lines": [], "methods": {}})
        entry["lines"] += ([""] if entry["lines"] else []) + lines
        return entry

    for arm in ARMS:
        methods = sorted({r["method"] for st in studies.values() for r in st.get("final", {}).values()
                          if r["arm"] == arm and r["method"].partition("+")[0] == "text2grad"})
        for method in methods:  # Text2Grad first ("text2grad" sorts before its "+variant"s)
            lines, numbers = pooled_lines(studies, arm, method)
            if lines:
                add(arm, lines)["methods"][method] = numbers
            lines, numbers = pooled_lines(studies, arm, method, matched_baseline(method))
            if lines:  # at the sweep's settings, against the information-matched baseline
                add(arm, lines).setdefault("matched", {})[method] = numbers
            for against in kl_baselines(method):
                makers = [("kl_on_validation", kl_on_validation_lines), ("kl_matched", kl_matched_lines)]
                if against is not None:  # the best scalar baseline differs per instance: its frontier is not one line
                    makers.append(("frontier_dominance", frontier_dominance_lines))
                for kind, make_lines in makers:
                    more, numbers = make_lines(studies, arm, method, against)
                    if more:
                        add(arm, more).setdefault(kind if against is None else f"{kind}_{against}", {})[method] = numbers
        for defended, control, key, what in DEFENCE_CONTROLS:
            lines, numbers = control_lines(studies, arm, defended, control, what)
            if lines:
                add(arm, lines)[key] = numbers
    first = next(iter(studies.values()))
    # what the results tables read: the shared settings (the instances differ only in task_seed), machine and date
    shared = {k: first.get(k) for k in ("cpu", "machine", "date", "settings_from") if first.get(k) is not None}
    runs_on = machines_of_runs(out)
    if runs_on:  # every instance's runs, not only the first instance's
        shared.update(machine=f"{runs_on[0]}, Python {platform.python_version()}", cpu=runs_on[1])
    identity = {k: v for k, v in first.get("identity", {}).items() if k != "task_seed"}
    study = {"command": command, "task_seeds": list(studies), "identity": identity, **shared, "pooled": pooled,
             "instances": {str(ts): {"sft": st["sft"], "final": st.get("final", {}), "sweep": st.get("sweep", {}),
                                     "kl_frontier": st.get("kl_frontier", {}), "critics": st.get("critics", {}),
                                     "machine": st.get("machine")} for ts, st in studies.items()}}
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "study.json", study)
    frontier_plot(studies, out / "frontier.png")
    md = pooled_markdown(studies, pooled, command, machine=shared.get("machine"))
    write_whole(out / "study.md", md + "\n")
    print(md)
    return study


def report_context(args: argparse.Namespace, stored: Mapping[str, Any]) -> StudyContext:
    """The context of a report-only pass: nothing is trained or loaded but the finished runs' results. The start
    policy's scores come from the stored study, or from the runs themselves (every curve starts at the SFT policy:
    validation in every run, test in the final runs)."""
    out = Path(args.output_dir)
    cfg = study_config(args, out / "shared")
    sft = dict(stored.get("sft", {}))
    starts = [result["curve"][0] for _, result in finished_results(out)]
    for split in ("val", "test"):
        if split not in sft:
            sft.update({split: p[split] for p in starts if split in p}) if any(split in p for p in starts) else None
    data = qs.stage_data(cfg, out / "shared")  # the task's files (generated in a moment: no training)
    ctx = StudyContext(
        sft=str(out / "shared" / "sft"), rl=str(data["rl"]), val_records=list(iter_jsonl(data["val"])),
        test_records=list(iter_jsonl(data["eval"])),
        rm="", dense_rm="", scalar_rm="", iterations=args.iterations, eval_every=args.eval_every,
        batch_size=args.batch_size or cfg.ppo_batch_size, response_length=cfg.response_length, kl_coef=cfg.kl_coef,
        target_kl=args.target_kl, out=str(out), kl_horizon=args.kl_horizon, use_chat_template=cfg.use_chat_template,
        sft_scores=sft, ppo_fields=preset_ppo_fields(args.preset, args.generation_backend))
    return ctx


def run_instance(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Every phase of ``args.phases`` on one task instance (``args.task_seed``) in ``args.output_dir``; returns its
    study (also written there as study.json, study.md and the plots). ``--phases report`` alone trains nothing: it
    reads whatever runs have finished (a study still running, or one copied back with --resume_from)."""
    t0 = time.perf_counter()
    keys = method_keys(args.arms, args.methods, args.variants, args.variant_methods)
    base = Setting(lr=args.base_lr, kl="fixed", lam=args.base_lambda)
    study_path = Path(args.output_dir) / "study.json"
    study: dict[str, Any] = json.loads(study_path.read_text()) if study_path.is_file() else {}
    report_only = set(args.phases) == {"report"}
    if report_only:
        ctx = report_context(args, study)
        if "val" not in ctx.sft_scores:
            print(f"[study] {args.output_dir}: no finished run yet, nothing to report")
            return {}
        found = sweep(ctx, keys, base, args.lrs, args.sweep_seed, args.jobs, args.sweep_knobs, args.lambdas,
                      args.kl_coefs, args.grid_extensions, train=False)
        # a stored sweep whose runs are not in this folder (an earlier machine's) is kept
        study["sweep"] = {**study.get("sweep", {}), **{k: v for k, v in found.items() if v["tried"]}}
    else:
        # the ablations run learned-arm Text2Grad (and the oracle critic), whatever --arms says
        ctx = build_context(args, keys + ([("learned", "text2grad")] if "ablation" in args.phases else []))
        if not ctx.rm_ensemble:
            keys = [(a, m) for a, m in keys if m.partition("+")[2] not in ENSEMBLE_VARIANTS]
    check_same_study(study.get("identity"), study_identity(args), args.output_dir)
    study["identity"] = study_identity(args)
    machine, cpu = machines_of_runs(Path(args.output_dir)) or (cpu_model(), cpu_name())
    study.update({"config": {k: v for k, v in vars(args).items()}, "sft": ctx.sft_scores,
                  "machine": f"{machine}, Python {platform.python_version()}", "command": command,
                  "cpu": cpu, "date": study_date(Path(args.output_dir), study.get("date"))})  # both read by results_tables
    # a critic whose files are not in this folder (e.g. not trained on this machine) keeps what study.json recorded
    study["critics"] = {**study.get("critics", {}), **critic_quality(Path(args.output_dir) / "shared")}
    study["config"].update(batch_size=ctx.batch_size, n_test=len(ctx.test_records), n_val=len(ctx.val_records),
                           policy="SmolLM2-135M-Instruct (LoRA SFT, LoRA PPO)" if args.preset == "smollm2" else
                           f"tiny Llama of the quickstart's {args.preset} preset")
    if "sweep" in args.phases:
        study["sweep"] = {**study.get("sweep", {}),
                          **sweep(ctx, keys, base, args.lrs, args.sweep_seed, args.jobs, args.sweep_knobs, args.lambdas,
                                  args.kl_coefs, args.grid_extensions)}
        study["sweep_sft"] = ctx.sft_scores  # the start policy the choices were made from
        _write_json(study_path, study)
    chosen = chosen_settings(study.get("sweep", {}), keys, base)
    if args.settings_from:  # a study too large to sweep on every instance takes an earlier sweep's choices
        stored_from = json.loads(Path(args.settings_from).read_text())
        table = inherited_sweep(stored_from, args.task_seed, args.settings_from)
        rows = inherited_settings(table, keys)
        chosen = {(a, m): Setting(**table[row]["chosen"]) if (row := rows[f"{a}/{m}"]) else base for a, m in keys}
        used = {row: table[row] for row in dict.fromkeys(rows.values()) if row}
        # the report says where each inherited choice sat in the grid it was chosen from, and what that grid swept
        study["settings_from"] = {"study": args.settings_from, "rows": rows, "edge_lines": edge_lines(used),
                                  "knobs": sorted({k for row in used.values() for k in row.get("knobs", [])}),
                                  **({"instance": args.task_seed} if "instances" in stored_from else {})}
    finals = [RunSpec(a, m, chosen[(a, m)], s, "final") for a, m in keys for s in args.seeds]
    if "final" in args.phases:
        run_all(ctx, finals, args.jobs)
    frontier = frontier_specs(frontier_keys(keys, getattr(args, "frontier_methods", None)), chosen, args.kl_frontier,
                              args.seeds, ctx.kl_coef, args.lr_frontier,
                              points_on_instance(getattr(args, "frontier_points", ()), args.task_seed), keys)
    if "frontier" in args.phases:
        run_all(ctx, frontier, args.jobs)
    quick = Setting(lr=1e-4, kl="fixed", lam=0.0)  # the quickstart's setting, where the collapse was seen
    ablations = [RunSpec("learned", "text2grad", quick, s, "ablation", name) for name in args.ablations for s in args.ablation_seeds]
    if "ablation" in args.phases:
        run_all(ctx, ablations, args.jobs)
    results = {s: r for s in [*finals, *frontier, *ablations] if (r := _load_result(ctx, s)) is not None}
    t2g = next(((a, m) for a, m in keys if m == "text2grad"), keys[0])
    study["paper_comparison_for"] = f"{t2g[0]}-arm {method_label(t2g[1])} at its chosen setting ({chosen[t2g].label()})"
    knobs = (study["settings_from"]["knobs"] if args.settings_from else
             sorted({k for v in study.get("sweep", {}).values() for k in v.get("knobs", [])}))
    study["paper_comparison"] = paper_comparison(_ppo_config(ctx, RunSpec(*t2g, chosen[t2g], 0, "final"),
                                                             Path(args.output_dir) / "unused"), knobs=knobs,
                                         inherited=bool(args.settings_from))
    # a folder without the final runs (e.g. a fresh machine) keeps the summary stored in study.json
    study["final"] = summarize_final(results, keys, args.seeds, ctx.batch_size) or study.get("final", {})
    study["matched"] = matched_comparisons(study)  # Text2Grad vs the information-matched baseline: the headline
    # what the report says is missing; a study that only swept (no final phase, no final run) asked for none
    study["requested_final"] = ({f"{a}/{m}": list(args.seeds) for a, m in keys}
                                if "final" in args.phases or study["final"] else {})
    # a phase whose runs are not in this folder keeps the summary stored in study.json (e.g. from an earlier machine)
    study["ablations"] = summarize_ablations(results) or study.get("ablations", {})
    study["kl_frontier"] = summarize_frontier(results, ctx.kl_coef) if frontier else study.get("kl_frontier", {})
    study["matched_on_validation"] = matched_on_validation(study)  # the headline, where both sides ran a frontier
    if frontier:  # what the report says is missing at the frontier's KL settings
        study["frontier_requested"] = len(frontier)
        study["frontier_not_run"] = runs_not_finished([s for s in frontier if s not in results], ctx.kl_coef, chosen)
    study["seconds"] = time.perf_counter() - t0
    _write_json(study_path, study)
    if study["final"]:
        plot(study["final"], Path(args.output_dir) / "curves.png")
        frontier_plot({args.task_seed: study}, Path(args.output_dir) / "frontier.png")
    md = markdown(study)
    write_whole(Path(args.output_dir) / "study.md", md + "\n")
    print(md)
    return study


if __name__ == "__main__":
    sys.exit(main())
