"""The quickstart run: every Text2Grad phase, offline, on the generated fact-summary task.

    python -m text2grad.apps.quickstart                      # the default run (~4 min on 2 idle CPU cores)
    python -m text2grad.apps.quickstart --preset ci          # a seconds-to-minutes smoke run
    python -m text2grad.apps.quickstart --preset large --output_dir runs/qs-large

Stages (each calls the phase's own CLI entry point, ``main(argv)``, exactly as the per-dataset scripts do):

1. task data        `text2grad.apps.quickstart.task.generate_task` -> data/{train,rl,eval,val}.jsonl
2. policy           tokenizer + tiny Llama (`text2grad.core.modeling`), then ``policy_optimization.sft``; cached
3. annotation       SFT-policy samples and noisy summaries, critiqued by ``annotation.cli --critic ...FactCritic``
4. reward model     ``reward_model.train`` then ``reward_model.evaluate``
5. policy optim.    ``policy_optimization.train`` with the reward model as feedback source, once per reward
                    mode (``nl_gradient`` and ``scalar``, same seed/budget/hyperparameters; side by side in their
                    own processes), run in chunks with ``--resume auto`` so the policy is evaluated every
                    ``eval_every`` iterations
6. evaluation       SFT vs. scalar PPO vs. Text2Grad on the eval split: fact score, ROUGE, BLEU
7. report           report/curves.png and report/index.html (`text2grad.apps.quickstart.report`)

Each phase can be pointed at real models and data instead (``--policy_model``, ``--sft_model``,
``--rm_base_model``, ``--reward_model``, ``--data_dir``, ``--critic``), and every phase accepts extra flags of its
own CLI (``--sft_args``, ``--rm_args``, ``--ppo_args``; JSON lists).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from policy_optimization.ppo_config import PPOConfig
from reward_model.serialization import PLAIN_TEMPLATE
from text2grad.apps.quickstart.presets import PRESETS, SMOLLM2_VLLM_HINT, resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.apps.quickstart.report import write_report
from text2grad.apps.quickstart.parallel import iterations_done, run_side_by_side, torch_threads
from text2grad.apps.quickstart.results import (
    PolicyEvaluator,
    StageClock,
    generate_responses,
    describe_speed,
    feedback_error_rates,
    installed_versions,
    machine_speed,
    peak_rss_mb,
    print_results,
    results_table,
    start_policy_name,
)
from text2grad.apps.quickstart.task import TaskConfig, config_fingerprint, corpus_texts, generate_task, noisy_summary
from text2grad.core.cli import EXIT_OK, RunFailed, run_cli
from text2grad.core.config import ConfigError, save_config
from text2grad.core.critics import load_object
from text2grad.core.data import iter_jsonl, write_jsonl
from text2grad.core.modeling import build_tiny_llama, is_adapter_only, merge_adapter_folder, train_tokenizer
from text2grad.core.vllm_engine import vllm_available

__all__ = ["QuickstartConfig", "PRESETS", "resolve", "run", "main", "stage_ppo", "stage_ppo_modes", "refresh_reward_model",
           "PPOResult"]

STAGES = ("task data", "start policy", "annotation", "reward model", "policy optimization",
          "evaluation", "report")


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


_COMMAND_LOG: list[Path] = []


def _call(module: str, argv: list[str]) -> None:
    """Run a phase CLI in-process (``module.main(argv)``); a non-zero exit code is an error.

    The command is printed and appended to ``<output_dir>/commands.sh``, so any phase can be rerun by hand.
    """
    line = f"python -m {module} " + " ".join(_quote(a) for a in argv)
    print(f"$ {line}", flush=True)
    for log in _COMMAND_LOG:
        with log.open("a") as fh:
            fh.write(line + "\n")
    t0 = time.perf_counter()
    code = load_object(f"{module}:main")(argv)
    if code:
        raise RuntimeError(f"python -m {module} exited with code {code} (command above)")
    print(f"    ({module}: {time.perf_counter() - t0:.1f} s; peak RSS so far {peak_rss_mb():.0f} MB)", flush=True)


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./:=," for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def _cache_root(cfg: QuickstartConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("TEXT2GRAD_CACHE") or Path.home() / ".cache" / "text2grad" / "quickstart"
    return Path(root)


def _cached(path: Path, cfg: QuickstartConfig, build: Callable[[Path], None], what: str) -> Path:
    """Build ``path`` unless a complete cached copy exists (``.complete`` is written last)."""
    done = path / ".complete"
    if done.is_file() and not cfg.no_cache:
        print(f"using cached {what}: {path} (pass --no_cache true to rebuild)", flush=True)
        return path
    if path.exists():
        shutil.rmtree(path)
    tmp = path.with_name(path.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    build(tmp)
    (tmp / ".complete").write_text(time.strftime("%Y-%m-%d %H:%M:%S"))
    tmp.replace(path)
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


# --------------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------------


def _task_config(cfg: QuickstartConfig) -> TaskConfig:
    return TaskConfig(seed=cfg.seed, n_train=cfg.n_train, n_rl=cfg.n_rl, n_eval=cfg.n_eval)


def stage_data(cfg: QuickstartConfig, out: Path) -> dict[str, Path]:
    """train/rl/eval splits, and a validation split (val.jsonl) of ``n_val`` other posts for early stopping."""
    data = out / "data"
    if cfg.data_dir:
        paths = {s: Path(cfg.data_dir) / f"{s}.jsonl" for s in ("train", "rl", "eval", "val")}
        needed = ("train", "rl", "eval", "val") if cfg.early_stopping else ("train", "rl", "eval")
        missing = [str(paths[s]) for s in needed if not paths[s].is_file()]
        if missing:
            raise FileNotFoundError(f"--data_dir lacks {missing}; it needs train.jsonl, rl.jsonl and eval.jsonl "
                                    f"(and val.jsonl with --early_stopping true)")
        return paths
    # The validation posts are generated after the eval posts from the same stream: the other splits stay as
    # they were without it, and no post is in two splits.
    with_val = replace(_task_config(cfg), n_eval=cfg.n_eval + cfg.n_val)
    splits = generate_task(with_val)
    splits["val"] = [dict(r, id=f"val-{i}") for i, r in enumerate(splits["eval"][cfg.n_eval:])]
    splits["eval"] = splits["eval"][: cfg.n_eval]
    paths = {}
    for split, records in splits.items():
        paths[split] = data / f"{split}.jsonl"
        write_jsonl(paths[split], records)
        print(f"{split:>5}: {len(records)} posts -> {paths[split]}")
    example = splits["train"][0]
    print(f"\nexample post:\n{example['prompt']}\nSFT target (imperfect on purpose):{example['completion']}\n"
          f"reference:{example['reference']}")
    return paths


def start_policy_note(cfg: QuickstartConfig) -> str:
    """What the start-policy stage does, for its header: an SFT run, or nothing for a policy given as sft_model."""
    if cfg.sft_model:
        return f"{start_policy_name(asdict(cfg))}, as given: no SFT"
    model = cfg.policy_model or "tokenizer, tiny Llama"
    return f"{model}, SFT (cached after the first run)"


def stage_policy(cfg: QuickstartConfig, data: dict[str, Path]) -> tuple[Path, Path]:
    """The SFT run: a cached tokenizer + tiny Llama (or ``policy_model``) fine-tuned by policy_optimization.sft.

    Returns ``(policy, reward_model_base)``: the checkpoint at ``policy_sft_steps`` (where PPO starts) and
    the end of the run at ``sft_steps`` (where the reward model starts); the same path when they are equal.
    """
    if cfg.sft_model:
        print(f"starting from {cfg.sft_model} as given (no SFT in this run)")
        return Path(cfg.sft_model), Path(cfg.sft_model)
    key = {
        "task": asdict(_task_config(cfg)) if not cfg.data_dir else str(Path(cfg.data_dir).resolve()),
        "policy_model": cfg.policy_model, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "layers": cfg.num_layers, "mlp": cfg.intermediate_size,
        "steps": cfg.sft_steps, "policy_steps": cfg.policy_sft_steps, "lr": cfg.sft_learning_rate, "decay": cfg.sft_decay_steps, "args": cfg.sft_args,
        "seed": cfg.seed, "v": 2,
    }
    if cfg.use_chat_template:  # conversational SFT records (the key of a plain run stays as it was)
        key["chat_template"] = True
    path = _cache_root(cfg) / f"policy-{config_fingerprint(key)}"
    early = cfg.policy_sft_steps < cfg.sft_steps

    def build(tmp: Path) -> None:
        base = cfg.policy_model
        if base is None:
            records = _read_jsonl(data["train"])
            corpus = corpus_texts(records) + _reward_model_template_texts(records[:50])
            tokenizer = train_tokenizer(corpus, vocab_size=cfg.vocab_size, kind="bpe")
            model = build_tiny_llama(tokenizer, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                                     intermediate_size=cfg.intermediate_size or None, num_heads=4,
                                     max_position_embeddings=512, seed=cfg.seed)
            n_params = sum(p.numel() for p in model.parameters())
            print(f"tokenizer: {len(tokenizer)} tokens; tiny Llama: {cfg.num_layers} layers, hidden "
                  f"{cfg.hidden_size}, {n_params / 1e6:.2f} M parameters")
            base = str(tmp / "init")
            tokenizer.save_pretrained(base)
            model.save_pretrained(base)
        _call("policy_optimization.sft", [
            "--model_name_or_path", base, "--dataset_path", str(data["train"]),
            "--prompt_template", "{prompt}", "--completion_template", "{completion}",
            "--output_dir", str(tmp / "sft"), "--use_lora", "false", "--max_steps", str(cfg.sft_steps),
            "--learning_rate", str(cfg.sft_learning_rate), "--warmup_steps", str(SFT_WARMUP_STEPS),
            *_sft_schedule_args(cfg),
            "--per_device_train_batch_size", "16", "--max_length", "256", "--logging_steps", str(max(1, cfg.sft_steps // 10)),
            # checkpoints every policy_sft_steps, all kept until the policy's is copied out below
            "--save_steps", str(cfg.policy_sft_steps if early else 10 ** 9),
            "--save_total_limit", str(cfg.sft_steps // cfg.policy_sft_steps + 1),
            "--seed", str(cfg.seed),
            # the tiny Llama's few hundred tokens: full logits cost less than TRL's vocabulary tiles (1.3x faster SFT)
            *(["--fused_lm_head", "false"] if cfg.policy_model is None else []),
            *(["--use_chat_template", "true"] if cfg.use_chat_template else []), *cfg.sft_args,
        ])
        if early:
            ckpt = tmp / "sft" / f"checkpoint-{cfg.policy_sft_steps}"
            if not (ckpt / "config.json").is_file():
                raise RuntimeError(f"the SFT run left no checkpoint at step {cfg.policy_sft_steps} ({ckpt})")
            (tmp / "policy").mkdir()
            for f in ckpt.iterdir():  # the weights, config and tokenizer, not the optimizer state
                if f.suffix in (".json", ".safetensors", ".model", ".txt") and f.name != "trainer_state.json":
                    shutil.copy(f, tmp / "policy" / f.name)
        _drop_checkpoints(tmp / "sft")

    done = _cached(path, cfg, build, "SFT policy")
    return (done / "policy" if early else done / "sft"), done / "sft"


SFT_WARMUP_STEPS = 30


def _sft_schedule_args(cfg: QuickstartConfig) -> list[str]:
    """Linear decay to zero at ``sft_decay_steps`` while training ``sft_steps``: a polynomial (power 1) schedule
    ending at ``lr * (decay - steps) / (decay - warmup)``, which is the linear schedule's value at ``sft_steps``, so
    every step's learning rate equals the longer run's."""
    if not cfg.sft_decay_steps or cfg.sft_decay_steps == cfg.sft_steps:
        return ["--lr_scheduler_type", "linear"]
    lr_end = cfg.sft_learning_rate * (cfg.sft_decay_steps - cfg.sft_steps) / (cfg.sft_decay_steps - SFT_WARMUP_STEPS)
    return ["--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", json.dumps({"lr_end": lr_end, "power": 1.0})]


def _drop_checkpoints(path: Path) -> None:
    """The trainer's checkpoints in ``path``, and in its ensemble members' folders: the cache keeps the final model."""
    for ckpt in [*path.glob("checkpoint-*"), *path.glob("member-*/checkpoint-*")]:
        shutil.rmtree(ckpt, ignore_errors=True)


def _reward_model_template_texts(records: list[dict[str, Any]]) -> list[str]:
    """The reward model's input template, so the tokenizer has tokens for its fixed words."""
    return [PLAIN_TEMPLATE.format(instruction=RM_INSTRUCTION, prompt=r["prompt"], response=r["completion"]) for r in records]


RM_INSTRUCTION = "Check the summary against the post: which facts are right, wrong or missing?"


def stage_reward_model(
    cfg: QuickstartConfig, data: dict[str, Path], sft: Path, rm_base: Path, out: Path, stages: StageClock
) -> tuple[Path, dict[str, Any]]:
    """Annotate responses with the critic, train the reward model on them, evaluate it on held-out ones.

    Half of the annotated responses are samples of the policy ``sft`` (its own mistakes); the reward model
    is fine-tuned from ``rm_base`` (or ``rm_base_model``)."""
    if cfg.reward_model:
        print(f"using the given reward model {cfg.reward_model}")
        return Path(cfg.reward_model), {}
    if not cfg.rm_base_model and is_adapter_only(rm_base):  # e.g. a LoRA SFT: the RM's adapter must name a base that holds it
        rm_base = merge_adapter_folder(rm_base, rm_base.with_name(rm_base.name + "-merged"))
    key = {"sft": str(sft.resolve()), "rm_base": str(rm_base.resolve()), "grounded": cfg.grounded_spans, "critic": cfg.critic, "critic_kwargs": cfg.critic_kwargs, "ann": cfg.annotation_args,
           "n": cfg.n_annotations, "p_wrong": cfg.rm_p_wrong, "base": cfg.rm_base_model, "steps": cfg.rm_steps, "lr": cfg.rm_learning_rate,
           "args": cfg.rm_args, "seed": cfg.seed, "v": 3}
    if cfg.rm_extra_policy_samples:  # (the key of a run without them stays as it was)
        key["extra_policy_samples"] = cfg.rm_extra_policy_samples
    if cfg.rm_extra_noisy_summaries:
        key["extra_noisy_summaries"] = cfg.rm_extra_noisy_summaries
    if cfg.rm_extra_replace_noisy:
        key["extra_replaces_noisy"] = True
    if cfg.use_chat_template:  # templated samples and RM inputs (the key of a plain run stays as it was)
        key["chat_template"] = True
    path = _cache_root(cfg) / f"reward_model-{config_fingerprint(key)}"

    def build(tmp: Path) -> None:
        train = _read_jsonl(data["train"])
        rng = random.Random(cfg.seed)
        rng.shuffle(train)
        n_policy = cfg.n_annotations // 2
        n_noisy = cfg.n_annotations - n_policy
        if n_policy + n_noisy > len(train):  # one response per post: the split caps the noisy half first
            n_policy, n_noisy = min(n_policy, len(train)), max(0, len(train) - n_policy)
            print(f"annotating {n_policy} SFT-policy samples and {n_noisy} noisy summaries: n_annotations "
                  f"{cfg.n_annotations} is capped at the {len(train)} training posts, one response each (more posts: "
                  "n_train; more policy samples, on the RL prompts: rm_extra_policy_samples)", flush=True)
        n_extra = cfg.rm_extra_policy_samples + cfg.rm_extra_noisy_summaries
        if cfg.rm_extra_replace_noisy:  # the annotation count stays; what the extra annotations are is what changes
            if n_extra > n_noisy:
                raise ValueError(f"rm_extra_replace_noisy: {n_extra} extra RL-prompt annotations cannot take the place "
                                 f"of {n_noisy} noisy summaries of training posts; ask for at most {n_noisy} "
                                 "(rm_extra_policy_samples + rm_extra_noisy_summaries), or raise n_annotations (or n_train)")
            n_noisy -= n_extra
            print(f"the {n_extra} extra RL-prompt annotations take the place of as many noisy summaries of training "
                  f"posts: {n_noisy} of those are annotated", flush=True)
        print(f"sampling {n_policy} summaries from the SFT policy (temperature 1) to annotate ...", flush=True)
        picked = train[:n_policy]
        samples = [g.text for g in generate_responses(sft, [r["prompt"] for r in picked], cfg.response_length, True, cfg.seed,
                                                      use_chat_template=cfg.use_chat_template)]
        # The noisy half has many more wrong facts than the SFT data (and some repeated clauses): a reward model
        # trained mostly on near-correct summaries learns to quote the *post's* facts instead of checking the
        # response's (measured: 81 % unmatched quotes, poor-token recall 0.5 % with the SFT data's noise rates).
        hard = TaskConfig(p_omit=0.1, p_wrong=cfg.rm_p_wrong, p_distractor=0.6)
        to_annotate = [
            {"id": f"policy-{r['id']}", "prompt": r["prompt"], "response": s} for r, s in zip(picked, samples)
        ] + [{"id": f"noisy-{r['id']}", "prompt": r["prompt"], "response": noisy_summary(rng, r["facts"], hard, p_repeat=0.2)}
             for r in train[n_policy : n_policy + n_noisy]]
        to_annotate += _extra_rl_annotations(cfg, data, sft, hard)
        rng.shuffle(to_annotate)
        write_jsonl(tmp / "to_annotate.jsonl", to_annotate)
        annotations = _annotate(cfg, tmp, *([data["train"], data["rl"]] if n_extra else [data["train"]]))
        # the held-out share of the annotations without the extra samples: those all add to the training set, as
        # the refresh's annotations do (in place of noisy summaries, they leave both sets' sizes as they were)
        added = 0 if cfg.rm_extra_replace_noisy else n_extra
        n_eval = max(8, (len(annotations) - added) // 10)
        write_jsonl(tmp / "rm_train.jsonl", annotations[n_eval:])
        write_jsonl(tmp / "rm_eval.jsonl", annotations[:n_eval])
        stages.start("reward model", f"{len(annotations) - n_eval} training / {n_eval} held-out annotations")
        _call("reward_model.train", [
            "--model_name_or_path", cfg.rm_base_model or str(rm_base), "--dataset_path", str(tmp / "rm_train.jsonl"),
            "--output_dir", str(tmp / "model"), "--use_lora", "false", "--instruction", RM_INSTRUCTION,
            "--prompt_format", _rm_prompt_format(cfg), "--max_length", "384", "--max_steps", str(cfg.rm_steps),
            "--learning_rate", str(cfg.rm_learning_rate), "--warmup_ratio", "0.05",
            "--per_device_train_batch_size", "16", "--logging_steps", str(max(1, cfg.rm_steps // 10)),
            "--save_steps", str(10 ** 9), "--seed", str(cfg.seed), *cfg.rm_args,
        ])
        _drop_checkpoints(tmp / "model")
        # as PPO will query it (eval/), and, when grounded, also free (eval-free/: how often it quotes exactly)
        for grounded, name in ((cfg.grounded_spans, "eval"), (False, "eval-free"))[: 1 + cfg.grounded_spans]:
            with torch_threads(cfg.decode_threads):
                _call("reward_model.evaluate", [
                    "--model_name_or_path", str(tmp / "model"), "--dataset_path", str(tmp / "rm_eval.jsonl"),
                    "--output_dir", str(tmp / name), "--batch_size", "32", "--max_new_tokens", "128",
                    "--grounded_spans", str(grounded).lower(),
                ])

    path = _cached(path, cfg, build, "reward model")
    for name in ("eval", "eval-free", "annotations.jsonl", "rm_eval.jsonl"):
        src = path / name
        if src.exists():
            dst = out / "reward_model" / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree(src, dst, dirs_exist_ok=True) if src.is_dir() else shutil.copy(src, dst))
    return path / "model", _rm_report(path / "eval")


def _extra_rl_annotations(cfg: QuickstartConfig, data: dict[str, Path], sft: Path,
                          hard: TaskConfig) -> list[dict[str, Any]]:
    """``cfg.rm_extra_policy_samples`` more SFT-policy samples and ``cfg.rm_extra_noisy_summaries`` more noisy
    summaries (at the reward model's error rates, ``hard``) to annotate, each on the RL prompts in turn from the first."""
    rl = _read_jsonl(data["rl"])
    in_turn = lambda n: [rl[i % len(rl)] for i in range(n)]  # noqa: E731 - the RL posts from the first, again if need be
    out = []
    if cfg.rm_extra_policy_samples:
        extra = in_turn(cfg.rm_extra_policy_samples)
        print(f"sampling {len(extra)} more summaries from the SFT policy on the RL prompts to annotate ...", flush=True)
        # another seed: a prompt also in the train split must not get the same sample twice
        more = generate_responses(sft, [r["prompt"] for r in extra], cfg.response_length, True, cfg.seed + 1,
                                  use_chat_template=cfg.use_chat_template)
        out += [{"id": f"policy-rl{i}-{r['id']}", "prompt": r["prompt"], "response": g.text}
                for i, (r, g) in enumerate(zip(extra, more))]
    if cfg.rm_extra_noisy_summaries:
        rng = random.Random(cfg.seed + 1)  # its own: the training posts' noisy summaries stay as they were
        posts = in_turn(cfg.rm_extra_noisy_summaries)
        out += [{"id": f"noisy-rl{i}-{r['id']}", "prompt": r["prompt"],
                 "response": noisy_summary(rng, r["facts"], hard, p_repeat=0.2)} for i, r in enumerate(posts)]
    return out


def _rm_prompt_format(cfg: QuickstartConfig) -> str:
    """How the reward model is prompted (reward_model.train --prompt_format; saved with the model, so
    reward_model.evaluate, PPO's reward-model critic and the report prompt it the same way): the chat template with
    ``use_chat_template`` (an instruct model's own format), else the plain template."""
    return "chat" if cfg.use_chat_template else "plain"


def _annotate(cfg: QuickstartConfig, folder: Path, *posts: Path) -> list[dict[str, Any]]:
    """``folder/to_annotate.jsonl`` critiqued by the annotation CLI into ``folder/annotations.jsonl`` (returned); the
    default FactCritic reads the facts of ``posts`` (the task files the responses' prompts come from)."""
    kwargs = cfg.critic_kwargs if cfg.critic_kwargs is not None else {
        "data_path": str(posts[0]) if len(posts) == 1 else [str(p) for p in posts]}
    _call("annotation.cli", [
        "--dataset_path", str(folder / "to_annotate.jsonl"), "--output", str(folder / "annotations.jsonl"),
        "--critic", cfg.critic, "--critic_kwargs", json.dumps(kwargs),
        "--field_map", json.dumps({"prompt": "prompt", "response": "response"}), *cfg.annotation_args,
    ])
    # In input order: the CLI appends each record as its worker finishes (so that a killed run resumes), which is
    # input order only while the workers finish in turn; a busy machine swaps some, and the held-out split and the
    # training order must not depend on that.
    position = {record["id"]: i for i, record in enumerate(_read_jsonl(folder / "to_annotate.jsonl"))}
    return sorted(_read_jsonl(folder / "annotations.jsonl"), key=lambda record: position[record["id"]])


def _rm_report(eval_dir: Path) -> dict[str, Any]:
    """The reward-model evaluation report (JSON written by reward_model.evaluate)."""
    reports = sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []
    for p in reports:
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return {}


@dataclass
class PPOResult:
    """One reward mode's run: the policy it ends with, its eval curve, and what early stopping chose."""

    policy: Path
    curve: list[dict[str, Any]]
    scores: dict[str, float]  # eval scores of ``policy``
    predictions: list[str]  # its greedy eval summaries
    selected_iteration: int
    validation: list[dict[str, float]] = field(default_factory=list)  # held-out critic score per eval point
    reward_models: list[str] = field(default_factory=list)  # the reward model of each chunk (refreshes)


EvalFn = Callable[[Path, list[dict[str, Any]]], tuple[dict[str, float], list[str]]]


def stage_ppo(cfg: QuickstartConfig, data: dict[str, Path], sft: Path, rm: Path, out: Path, mode: str,
              eval_fn: EvalFn) -> PPOResult:
    """Policy optimization in ``mode``, in chunks of ``eval_every`` iterations; eval after each chunk.

    Defences against reward-model exploitation (off by default): ``early_stopping`` scores every eval point
    on the validation split with the critic and keeps the best policy (the SFT policy included);
    ``rm_refresh`` retrains the reward model on each chunk's rollouts, annotated by the critic."""
    run_dir = out / f"ppo-{mode}"
    base = [
        "--model_name_or_path", str(sft), "--dataset_path", str(data["rl"]), "--prompt_template", "{prompt}",
        "--reward_mode", mode, "--use_lora", "false", "--output_dir", str(run_dir),
        "--batch_size", str(cfg.ppo_batch_size), "--num_mini_batches", "2", "--num_ppo_epochs", "2",
        "--learning_rate", str(cfg.ppo_learning_rate), "--lr_scheduler_type", "constant",
        "--kl_coef", str(cfg.kl_coef), "--lam", str(cfg.gae_lambda), "--adaptive_kl", "false",
        "--response_length", str(cfg.response_length), "--generation_backend", cfg.generation_backend,
        "--temperature", "0.7", "--vf_coef", "0.1", "--save_steps", "0", "--save_total_limit", "1",
        # a quote labels only its first occurrence: repeating a praised phrase must not pay
        "--occurrence", "first",
        "--seed", str(cfg.ppo_seed), "--log_samples", str(cfg.ppo_batch_size),  # every rollout, for the report
        # the ci preset's tiny reward model needs 1.0 (see the config field); every iteration's rate is in results.json
        "--max_feedback_error_rate", str(cfg.max_feedback_error_rate),
        # the policy's prompts through its chat template (the reward model still reads the raw post: feedback_prompt)
        *(["--use_chat_template", "true"] if cfg.use_chat_template else []),
    ]
    val_records = _read_jsonl(data["val"]) if cfg.early_stopping else []
    replay_file = rm.parent / "rm_train.jsonl"  # the reward model's own annotations (replayed by refreshes)
    scores, preds = eval_fn(sft, [])
    result = PPOResult(policy=sft, curve=[{"iteration": 0, **scores}], scores=scores, predictions=preds,
                       selected_iteration=0)
    best = -float("inf")
    if cfg.early_stopping:
        best = eval_fn(sft, val_records)[0]["fact_score"]
        result.validation.append({"iteration": 0, "fact_score": best})
    done = 0
    while done < cfg.ppo_iterations:
        start, done = done, min(cfg.ppo_iterations, done + cfg.eval_every)
        resume = ["--resume", "auto"] if start > 0 else ["--overwrite_output_dir", "true"]
        if start > 0 and cfg.rm_refresh:  # the feedback source's path changes (logged in config_changes.jsonl)
            resume += ["--accept_config_changes", "true"]
        result.reward_models.append(str(rm))
        _call("policy_optimization.train", base + [*_ppo_feedback_args(cfg, data, rm, sft), "--num_iterations", str(done),
                                                   *resume, *cfg.mode_ppo_args.get(mode, []), *cfg.ppo_args])
        reached = max((r["iteration"] for r in _read_jsonl(run_dir / "metrics.jsonl")), default=0)
        if reached < done:  # the trainer stops gracefully on Ctrl-C/SIGTERM; so does the quickstart
            raise RuntimeError(f"policy optimization ({mode}) stopped at iteration {reached} of {done}; "
                               f"rerun the same command to start over")
        scores, preds = eval_fn(run_dir / "policy", [])
        result.curve.append({"iteration": done, **scores})
        print(f"[{mode}] iteration {done}: eval fact_score {scores['fact_score']:.3f}", flush=True)
        if cfg.early_stopping:
            val = eval_fn(run_dir / "policy", val_records)[0]["fact_score"]
            result.validation.append({"iteration": done, "fact_score": val})
            print(f"[{mode}] iteration {done}: validation fact_score {val:.3f} (best {max(best, val):.3f})", flush=True)
            if val > best:
                best = val
                _replace_dir(run_dir / "policy", run_dir / "selected_policy")
                result.policy, result.scores, result.predictions, result.selected_iteration = (
                    run_dir / "selected_policy", scores, preds, done)
        else:
            result.policy, result.scores, result.predictions, result.selected_iteration = run_dir / "policy", scores, preds, done
        if cfg.rm_refresh and done < cfg.ppo_iterations and cfg.ppo_feedback == "reward_model":
            rm = refresh_reward_model(cfg, data, rm, replay_file, run_dir, start, done)
    (run_dir / "eval_curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in result.curve))
    if cfg.early_stopping:
        print(f"[{mode}] early stopping kept iteration {result.selected_iteration} (validation "
              f"{[v['fact_score'] for v in result.validation]})", flush=True)
    return result


def _replace_dir(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def refresh_reward_model(cfg: QuickstartConfig, data: dict[str, Path], rm: Path, replay_file: Path, run_dir: Path,
                         start: int, done: int) -> Path:
    """Annotate the rollouts of iterations ``start+1..done`` with the critic and continue training ``rm`` on them,
    mixed with as many of its original annotations (replay, so it does not forget them). Returns the new model."""
    refresh = run_dir / f"rm-refresh-{done}"
    refresh.mkdir(parents=True, exist_ok=True)
    rows = [r for r in _read_jsonl(run_dir / "samples.jsonl") if start < r["iteration"] <= done]
    write_jsonl(refresh / "to_annotate.jsonl", [
        {"id": f"it{r['iteration']}-{i}", "prompt": r.get("feedback_prompt") or r["prompt"], "response": r["response"]}
        for i, r in enumerate(rows)])
    fresh = _annotate(cfg, refresh, data["rl"])
    replay = _read_jsonl(replay_file) if replay_file.is_file() else []
    random.Random(cfg.ppo_seed * 1000 + done).shuffle(replay)
    write_jsonl(refresh / "rm_train.jsonl", fresh + replay[: len(fresh)])
    _call("reward_model.train", [
        "--model_name_or_path", str(rm), "--dataset_path", str(refresh / "rm_train.jsonl"),
        "--output_dir", str(refresh / "model"), "--use_lora", "false", "--instruction", RM_INSTRUCTION,
        "--prompt_format", _rm_prompt_format(cfg), "--max_length", "384", "--max_steps", str(cfg.rm_refresh_steps),
        "--learning_rate", str(cfg.rm_learning_rate), "--warmup_ratio", "0.0", "--per_device_train_batch_size", "16",
        "--logging_steps", str(max(1, cfg.rm_refresh_steps // 4)), "--save_steps", str(10 ** 9),
        "--seed", str(cfg.ppo_seed), *cfg.rm_args,
    ])
    _drop_checkpoints(refresh / "model")
    return refresh / "model"


def stage_ppo_modes(cfg: QuickstartConfig, data: dict[str, Path], sft: Path, rm: Path, out: Path,
                    evaluator: PolicyEvaluator) -> dict[str, PPOResult]:
    """`stage_ppo` for every reward mode: side by side in separate processes (``parallel_modes``; each mode's output
    in ``out/ppo-<mode>.log``, a progress bar here), or one after the other in this process."""
    if not cfg.parallel_modes or len(cfg.modes) == 1:
        with torch_threads(cfg.decode_threads):
            return {mode: stage_ppo(cfg, data, sft, rm, out, mode, evaluator) for mode in cfg.modes}
    metrics = [out / f"ppo-{mode}" / "metrics.jsonl" for mode in cfg.modes]
    for stale in metrics:  # from an earlier run in this output_dir: the progress bar counts the new one's
        stale.unlink(missing_ok=True)
    done = run_side_by_side(
        [(f"policy optimization ({mode})", stage_ppo, (cfg, data, sft, rm, out, mode, evaluator)) for mode in cfg.modes],
        [out / f"ppo-{mode}.log" for mode in cfg.modes],
        progress=lambda: (sum(iterations_done(m) for m in metrics), cfg.ppo_iterations * len(metrics)),
        setup=partial(_log_commands_to, out / "commands.sh"), threads=cfg.decode_threads or 1,
        desc="PPO iterations, " + " + ".join(cfg.modes),
    )
    for mode, result in zip(cfg.modes, done):
        validation = {v["iteration"]: v["fact_score"] for v in result.validation}
        for point in result.curve[1:]:
            val = f", validation {validation[point['iteration']]:.3f}" if point["iteration"] in validation else ""
            print(f"[{mode}] iteration {point['iteration']}: eval fact_score {point['fact_score']:.3f}{val}")
        if cfg.early_stopping:
            print(f"[{mode}] early stopping kept iteration {result.selected_iteration}")
    return dict(zip(cfg.modes, done))


def _log_commands_to(path: Path) -> None:
    """In a worker process: append the phase commands it runs to the run's commands.sh, as this process does."""
    _COMMAND_LOG[:] = [path]


def _ppo_feedback_args(cfg: QuickstartConfig, data: dict[str, Path], rm: Path, policy: Path) -> list[str]:
    if cfg.ppo_feedback == "critic":
        kwargs = cfg.critic_kwargs if cfg.critic_kwargs is not None else {"data_path": str(data["rl"])}
        return ["--critic", cfg.critic, "--critic_kwargs", json.dumps(kwargs)]
    kwargs = {"path": str(rm), "max_new_tokens": 128, "batch_size": 64, "grounded_spans": cfg.grounded_spans}
    if cfg.generation_backend == "vllm":
        # the policy's engine: the same tokenizer (the policy's own; the reward model's adapter folder holds a copy)
        # and the engine settings PPO asks for, so one engine serves the rollouts and the critiques
        defaults = PPOConfig()
        kwargs.update(backend="vllm", tokenizer_name_or_path=str(policy),
                      vllm_kwargs={"gpu_memory_utilization": defaults.vllm_gpu_memory_utilization,
                                   "cpu_kv_cache_gb": defaults.vllm_cpu_kv_cache_gb})
    return ["--critic", "reward_model", "--critic_kwargs", json.dumps(kwargs)]


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def run(cfg: QuickstartConfig) -> dict[str, Any]:
    """Run every stage; returns the summary written to ``output_dir/results.json``."""
    cfg = resolve(cfg)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "quickstart_config.yaml")
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# The phase commands this quickstart ran, in order.\n")
    _COMMAND_LOG[:] = [out / "commands.sh"]
    stages = StageClock(STAGES)
    versions = installed_versions()
    speed = machine_speed()  # printed and saved, so that stage times from different machines can be compared
    print(f"Text2Grad quickstart (preset {cfg.preset}, seed {cfg.seed}) -> {out}\n{describe_speed(speed)}", flush=True)
    if cfg.preset == "smollm2" and cfg.generation_backend == "hf" and not vllm_available():
        print(f"note: {SMOLLM2_VLLM_HINT}", flush=True)

    stages.start("task data", "generated fact-summary posts with distractors")
    data = stage_data(cfg, out)
    eval_records = _read_jsonl(data["eval"])

    stages.start("start policy", start_policy_note(cfg))
    sft, rm_base = stage_policy(cfg, data)

    stages.start("annotation", f"critic {cfg.critic}")
    rm, rm_report = stage_reward_model(cfg, data, sft, rm_base, out, stages)

    stages.start("policy optimization", " vs ".join(
        m + (f" ({' '.join(cfg.mode_ppo_args[m])})" if cfg.mode_ppo_args.get(m) else "") for m in cfg.modes))
    evaluator = PolicyEvaluator(sft, eval_records, cfg.response_length, cfg.use_chat_template)
    with torch_threads(cfg.decode_threads):  # the SFT policy's scores, once, before the modes start
        evaluator(sft, [])
        if cfg.early_stopping:
            evaluator(sft, _read_jsonl(data["val"]))
    runs = stage_ppo_modes(cfg, data, sft, rm, out, evaluator)
    policies: dict[str, Path] = {"sft": sft, **{m: r.policy for m, r in runs.items()}}
    curves = {m: r.curve for m, r in runs.items()}

    stages.start("evaluation", "greedy summaries of the eval split (final policies, evaluated after their last chunk)")
    results = {"sft": evaluator.sft_results["eval"][0], **{m: r.scores for m, r in runs.items()}}
    predictions = {"sft": evaluator.sft_results["eval"][1], **{m: r.predictions for m, r in runs.items()}}
    print(results_table(results, start_policy_name(asdict(cfg))))

    write_jsonl(out / "eval_predictions.jsonl", [
        {"id": r["id"], "reference": r["reference"], **{name: predictions[name][i] for name in predictions}}
        for i, r in enumerate(eval_records)
    ])

    stages.start("report", "curves.png and index.html")
    report = write_report(
        out / "report", eval_records=eval_records, policies=policies, curves=curves,
        metrics_files={m: out / f"ppo-{m}" / "metrics.jsonl" for m in cfg.modes}, reward_model=rm,
        results=results, rm_report=rm_report, n_samples=cfg.n_report_samples, response_length=cfg.response_length,
        seed=cfg.seed, grounded_spans=cfg.grounded_spans, versions=versions, use_chat_template=cfg.use_chat_template,
        commands=(out / "commands.sh").read_text().splitlines()[2:], start_name=start_policy_name(asdict(cfg)),
        max_feedback_error_rate=cfg.max_feedback_error_rate,
        selected={m: r.selected_iteration for m, r in runs.items()},
        mode_args={m: cfg.mode_ppo_args.get(m, []) for m in cfg.modes},
    )
    stages.finish()
    summary = {
        "config": asdict(cfg), "results": results, "curves": curves, "reward_model_eval": rm_report,
        "logprob_shift": report["logprob_shift"], "logprob_shift_by_position": report["logprob_shift_by_position"],
        "logprob_shift_true": report["logprob_shift_true"],
        "logprob_shift_true_by_position": report["logprob_shift_true_by_position"],
        "interpretation": report["interpretation"],
        "selection": {m: {"selected_iteration": r.selected_iteration, "validation": r.validation,
                          "reward_models": r.reward_models} for m, r in runs.items()},
        "feedback_error_rate": feedback_error_rates({m: out / f"ppo-{m}" / "metrics.jsonl" for m in cfg.modes}),
        "max_feedback_error_rate": cfg.max_feedback_error_rate,
        "versions": versions, "machine_speed": speed, "stage_seconds": stages.times,
        "stage_peak_rss_mb": stages.peak_rss_mb,
        "total_seconds": time.perf_counter() - stages.start_all, "png": str(report["png"]), "html": str(report["html"]),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    print_results(summary)
    return summary


def run_quickstart(cfg: QuickstartConfig) -> int:
    try:
        run(cfg)
    except ValueError as exc:  # a bad setting (ConfigError, DataError among them)
        raise ConfigError(str(exc)) from None
    except RuntimeError as exc:  # a phase failed: the work did not get done
        raise RunFailed(str(exc)) from None
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(QuickstartConfig, run_quickstart, argv)
