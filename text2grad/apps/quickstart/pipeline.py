"""The quickstart run: every Text2Grad phase, offline, on the generated fact-summary task.

    python -m text2grad.apps.quickstart                      # the default run (~6.5 min on 2 idle CPU cores)
    python -m text2grad.apps.quickstart --preset ci          # a seconds-to-minutes smoke run
    python -m text2grad.apps.quickstart --preset large --output_dir runs/qs-large

Stages (each calls the phase's own CLI entry point, ``main(argv)``, exactly as the per-dataset scripts do):

1. task data        `text2grad.apps.quickstart.task.write_task` -> data/{train,rl,eval}.jsonl
2. policy           tokenizer + tiny Llama (`text2grad.core.modeling`), then ``policy_optimization.sft``; cached
3. annotation       SFT-policy samples and noisy summaries, critiqued by ``annotation.cli --critic ...FactCritic``
4. reward model     ``reward_model.train`` then ``reward_model.evaluate``
5. policy optim.    ``policy_optimization.train`` with the reward model as feedback source, once per reward
                    mode (``nl_gradient`` and ``scalar``, same seed/budget/hyperparameters), run in chunks with
                    ``--resume auto`` so the policy is evaluated every ``eval_every`` iterations
6. evaluation       SFT vs. scalar PPO vs. Text2Grad on the eval split: fact score, ROUGE, BLEU
7. report           report/curves.png and report/index.html (`text2grad.apps.quickstart.report`)

Each phase can be pointed at real models and data instead (``--policy_model``, ``--sft_model``,
``--rm_base_model``, ``--reward_model``, ``--data_dir``, ``--critic``), and every phase accepts extra flags of its
own CLI (``--sft_args``, ``--rm_args``, ``--ppo_args``; JSON lists).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from text2grad.apps.quickstart.task import (
    TaskConfig,
    config_fingerprint,
    corpus_texts,
    fact_accuracy,
    noisy_summary,
    write_task,
)

__all__ = ["QuickstartConfig", "PRESETS", "resolve", "run", "main"]

Preset = Literal["ci", "default", "large"]


def _f(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class QuickstartConfig:
    """The embedded default: a complete offline Text2Grad run on a generated toy task.

    Fields left at None take their value from the preset (see PRESETS); set them to override one knob.
    """

    output_dir: str = _f("runs/quickstart", "Where data, models, metrics and the report go.")
    preset: Preset = _f("default", "Size preset: ci (smoke test, ~1-3 min), default (~6.5 min on 2 idle cores), large.")
    seed: int = _f(0, "Seed of the task generator, the tiny models and every phase.")
    ppo_seed: int | None = _f(None, "Seed of policy optimization only (default: seed); the benchmark varies it.")
    cache_dir: str | None = _f(
        None, "Cache of trained policies and reward models, keyed by their config (default: $TEXT2GRAD_CACHE or "
        "~/.cache/text2grad/quickstart). A second run with the same settings skips those phases."
    )
    no_cache: bool = _f(False, "Retrain the policy and reward model even if a cached one exists.")
    modes: list[str] = _f(["nl_gradient", "scalar"], "Reward modes to train, side by side with the same settings.")

    # ---- data
    data_dir: str | None = _f(None, "Use train/rl/eval.jsonl from this directory (quickstart task format) instead of generating.")
    n_train: int | None = _f(None, "Generated SFT/annotation posts.")
    n_rl: int | None = _f(None, "Generated RL prompts.")
    n_eval: int | None = _f(None, "Generated eval posts.")

    # ---- policy
    policy_model: str | None = _f(None, "Base policy (hub id or path) to fine-tune instead of the tiny Llama.")
    sft_model: str | None = _f(None, "An already fine-tuned policy (hub id or path): skips tokenizer, model and SFT.")
    vocab_size: int | None = _f(None, "Tokenizer vocabulary of the tiny policy.")
    hidden_size: int | None = _f(None, "Hidden size of the tiny Llama.")
    num_layers: int | None = _f(None, "Layers of the tiny Llama.")
    sft_steps: int | None = _f(None, "SFT optimizer steps (the end of this run is the reward model's base).")
    policy_sft_steps: int | None = _f(
        None, "PPO starts from the SFT checkpoint at this step (default: half of sft_steps): a policy that still "
        "gets facts wrong, leaving room for RL. The reward model starts from the end of the same SFT run, which "
        "checks facts more reliably (reward models are usually at least as strong as the policy). Equal to "
        "sft_steps: one model for both."
    )
    sft_learning_rate: float | None = _f(None, "SFT learning rate.")
    sft_args: list[str] = _f([], "Extra flags for policy_optimization.sft (JSON list), e.g. '[\"--use_lora\", \"true\"]'.")

    # ---- annotation and reward model
    critic: str = _f("text2grad.apps.quickstart.task:FactCritic", "Annotation critic (annotation.cli --critic).")
    critic_kwargs: dict[str, Any] | None = _f(None, "Critic kwargs (default: the FactCritic reads the train split).")
    annotation_args: list[str] = _f([], "Extra flags for annotation.cli (JSON list), e.g. for --critic llm: "
                                    "'[\"--model\", \"gpt-4o\", \"--dataset\", \"slf5k\"]'.")
    n_annotations: int | None = _f(None, "Responses to annotate (half SFT-policy samples, half noisy summaries).")
    rm_p_wrong: float = _f(0.4, "Per-fact error rate of the generated half of the reward model's training responses.")
    rm_base_model: str | None = _f(None, "Base of the reward model (default: the SFT policy).")
    reward_model: str | None = _f(None, "An already trained reward model: skips annotation and RM training.")
    rm_steps: int | None = _f(None, "Reward-model optimizer steps.")
    rm_learning_rate: float | None = _f(None, "Reward-model learning rate.")
    rm_args: list[str] = _f([], "Extra flags for reward_model.train (JSON list).")
    grounded_spans: bool = _f(
        True, "Grounded span decoding for the reward model's feedback during PPO and in its evaluation: every "
        "quote is forced to be a substring of the response (reward_model.inference, text2grad.core.generation)."
    )

    # ---- policy optimization
    ppo_feedback: Literal["reward_model", "critic"] = _f(
        "reward_model", "Feedback source of policy optimization: the trained reward model (the method), or the "
        "annotation critic itself (an oracle ablation that separates reward-model quality from the RL algorithm)."
    )
    ppo_iterations: int | None = _f(None, "PPO iterations per mode.")
    ppo_batch_size: int | None = _f(None, "Rollouts per PPO iteration.")
    ppo_learning_rate: float | None = _f(None, "PPO learning rate (full fine-tuning of the tiny policy).")
    kl_coef: float | None = _f(None, "KL penalty coefficient (fixed).")
    eval_every: int | None = _f(None, "Evaluate the policy every N PPO iterations (PPO runs in chunks with --resume auto).")
    ppo_args: list[str] = _f([], "Extra flags for policy_optimization.train (JSON list).")

    # ---- evaluation and report
    response_length: int = _f(40, "Max new tokens of a summary.")
    n_report_samples: int = _f(8, "Eval responses shown token by token in the HTML report.")


# Preset values for every None field above. ``default`` is sized for < 10 min on a 2-core CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "ci": dict(
        n_train=160, n_rl=32, n_eval=16, vocab_size=420, hidden_size=32, num_layers=2, sft_steps=12,
        sft_learning_rate=3e-3, n_annotations=48, rm_steps=8, rm_learning_rate=2e-3, ppo_iterations=4,
        ppo_batch_size=8, ppo_learning_rate=3e-4, kl_coef=0.05, eval_every=2,
    ),
    "default": dict(
        n_train=2000, n_rl=256, n_eval=100, vocab_size=800, hidden_size=128, num_layers=2, sft_steps=1200,
        sft_learning_rate=3e-3, n_annotations=3000, rm_steps=800, rm_learning_rate=2e-3, ppo_iterations=30,
        ppo_batch_size=16, ppo_learning_rate=1e-4, kl_coef=0.1, eval_every=10,
    ),
    "large": dict(
        n_train=4000, n_rl=1024, n_eval=300, vocab_size=1000, hidden_size=192, num_layers=4, sft_steps=2000,
        sft_learning_rate=2e-3, n_annotations=3000, rm_steps=1500, rm_learning_rate=1e-3, ppo_iterations=150,
        ppo_batch_size=32, ppo_learning_rate=1e-4, kl_coef=0.1, eval_every=25,
    ),
}

STAGES = ("task data", "policy (tokenizer, tiny Llama, SFT)", "annotation", "reward model", "policy optimization",
          "evaluation", "report")


def resolve(cfg: QuickstartConfig) -> QuickstartConfig:
    """Fill None fields from the preset; check the result."""
    if cfg.preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {cfg.preset!r}")
    values = {k: v for k, v in PRESETS[cfg.preset].items() if getattr(cfg, k) is None}
    out = replace(cfg, **values)
    if out.ppo_seed is None:
        out = replace(out, ppo_seed=out.seed)
    if out.policy_sft_steps is None:
        out = replace(out, policy_sft_steps=max(1, out.sft_steps // 2))
    bad = [m for m in out.modes if m not in ("nl_gradient", "scalar", "dense", "mixed")]
    if bad or not out.modes:
        raise ValueError(f"modes must be a non-empty list of nl_gradient, scalar, dense, mixed; got {out.modes}")
    if out.ppo_iterations < 1 or out.eval_every < 1:
        raise ValueError("ppo_iterations and eval_every must be >= 1")
    if not 1 <= out.policy_sft_steps <= out.sft_steps:
        raise ValueError(f"policy_sft_steps must be between 1 and sft_steps ({out.sft_steps}); got {out.policy_sft_steps}")
    return out


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


class _Stages:
    """Numbered stage headers with the time each stage took."""

    def __init__(self, names: Sequence[str]):
        self.names, self.index, self.t0, self.times = list(names), 0, None, {}
        self.start_all = time.perf_counter()

    def start(self, name: str, note: str = "") -> None:
        self.finish()
        self.index = self.names.index(name) + 1
        self.current, self.t0 = name, time.perf_counter()
        line = f"[{self.index}/{len(self.names)}] {name}" + (f" - {note}" if note else "")
        print(f"\n{'=' * 100}\n{line}\n{'=' * 100}", flush=True)

    def finish(self) -> None:
        if self.t0 is not None:
            self.times[self.current] = time.perf_counter() - self.t0
            print(f"--- {self.current}: {self.times[self.current]:.1f} s", flush=True)
            self.t0 = None


_COMMAND_LOG: list[Path] = []


def _call(module: str, argv: list[str]) -> None:
    """Run a phase CLI in-process (``module.main(argv)``); a non-zero exit code is an error.

    The command is printed and appended to ``<output_dir>/commands.sh``, so any phase can be rerun by hand.
    """
    import importlib

    line = f"python -m {module} " + " ".join(_quote(a) for a in argv)
    print(f"$ {line}", flush=True)
    for log in _COMMAND_LOG:
        with log.open("a") as fh:
            fh.write(line + "\n")
    code = importlib.import_module(module).main(argv)
    if code:
        raise RuntimeError(f"python -m {module} exited with code {code} (command above)")


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
    from text2grad.core.data import iter_jsonl

    return list(iter_jsonl(path))


# --------------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------------


def _task_config(cfg: QuickstartConfig) -> TaskConfig:
    return TaskConfig(seed=cfg.seed, n_train=cfg.n_train, n_rl=cfg.n_rl, n_eval=cfg.n_eval)


def stage_data(cfg: QuickstartConfig, out: Path) -> dict[str, Path]:
    data = out / "data"
    if cfg.data_dir:
        paths = {s: Path(cfg.data_dir) / f"{s}.jsonl" for s in ("train", "rl", "eval")}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"--data_dir lacks {missing}; it needs train.jsonl, rl.jsonl and eval.jsonl")
        return paths
    paths = write_task(_task_config(cfg), data)
    for split, path in paths.items():
        print(f"{split:>5}: {sum(1 for _ in path.open())} posts -> {path}")
    example = _read_jsonl(paths["train"])[0]
    print(f"\nexample post:\n{example['prompt']}\nSFT target (imperfect on purpose):{example['completion']}\n"
          f"reference:{example['reference']}")
    return paths


def stage_policy(cfg: QuickstartConfig, data: dict[str, Path]) -> tuple[Path, Path]:
    """The SFT run: a cached tokenizer + tiny Llama (or ``policy_model``) fine-tuned by policy_optimization.sft.

    Returns ``(policy, reward_model_base)``: the checkpoint at ``policy_sft_steps`` (where PPO starts) and
    the end of the run at ``sft_steps`` (where the reward model starts); the same path when they are equal.
    """
    if cfg.sft_model:
        print(f"using the given SFT policy {cfg.sft_model}")
        return Path(cfg.sft_model), Path(cfg.sft_model)
    key = {
        "task": asdict(_task_config(cfg)) if not cfg.data_dir else str(Path(cfg.data_dir).resolve()),
        "policy_model": cfg.policy_model, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "layers": cfg.num_layers,
        "steps": cfg.sft_steps, "policy_steps": cfg.policy_sft_steps, "lr": cfg.sft_learning_rate, "args": cfg.sft_args,
        "seed": cfg.seed, "v": 2,
    }
    path = _cache_root(cfg) / f"policy-{config_fingerprint(key)}"
    early = cfg.policy_sft_steps < cfg.sft_steps

    def build(tmp: Path) -> None:
        from text2grad.core.modeling import build_tiny_llama, train_tokenizer

        base = cfg.policy_model
        if base is None:
            records = _read_jsonl(data["train"])
            corpus = corpus_texts(records) + _reward_model_template_texts(records[:50])
            tokenizer = train_tokenizer(corpus, vocab_size=cfg.vocab_size, kind="bpe")
            model = build_tiny_llama(tokenizer, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                                     num_heads=4, max_position_embeddings=512, seed=cfg.seed)
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
            "--learning_rate", str(cfg.sft_learning_rate), "--warmup_steps", "30", "--lr_scheduler_type", "linear",
            "--per_device_train_batch_size", "16", "--max_length", "256", "--logging_steps", str(max(1, cfg.sft_steps // 10)),
            # checkpoints every policy_sft_steps, all kept until the policy's is copied out below
            "--save_steps", str(cfg.policy_sft_steps if early else 10 ** 9),
            "--save_total_limit", str(cfg.sft_steps // cfg.policy_sft_steps + 1),
            "--seed", str(cfg.seed), *cfg.sft_args,
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


def _drop_checkpoints(path: Path) -> None:
    for ckpt in path.glob("checkpoint-*"):
        shutil.rmtree(ckpt, ignore_errors=True)


def _reward_model_template_texts(records: list[dict[str, Any]]) -> list[str]:
    """The reward model's input template, so the tokenizer has tokens for its fixed words."""
    from reward_model.serialization import PLAIN_TEMPLATE

    return [PLAIN_TEMPLATE.format(instruction=RM_INSTRUCTION, prompt=r["prompt"], response=r["completion"]) for r in records]


RM_INSTRUCTION = "Check the summary against the post: which facts are right, wrong or missing?"


def _generate_texts(model_path: Path, prompts: list[str], max_new_tokens: int, do_sample: bool, seed: int,
                    batch_size: int = 64) -> list[str]:
    import torch

    from text2grad.core.generation import generate
    from text2grad.core.modeling import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(model_path))
    model = load_causal_lm(str(model_path)).eval()
    torch.manual_seed(seed)
    gens = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                    do_sample=do_sample, temperature=1.0, show_progress=True)
    return [g.text for g in gens]


def stage_reward_model(
    cfg: QuickstartConfig, data: dict[str, Path], sft: Path, rm_base: Path, out: Path, stages: _Stages
) -> tuple[Path, dict[str, Any]]:
    """Annotate responses with the critic, train the reward model on them, evaluate it on held-out ones.

    Half of the annotated responses are samples of the policy ``sft`` (its own mistakes); the reward model
    is fine-tuned from ``rm_base`` (or ``rm_base_model``)."""
    if cfg.reward_model:
        print(f"using the given reward model {cfg.reward_model}")
        return Path(cfg.reward_model), {}
    key = {"sft": str(sft.resolve()), "rm_base": str(rm_base.resolve()), "grounded": cfg.grounded_spans, "critic": cfg.critic, "critic_kwargs": cfg.critic_kwargs, "ann": cfg.annotation_args,
           "n": cfg.n_annotations, "p_wrong": cfg.rm_p_wrong, "base": cfg.rm_base_model, "steps": cfg.rm_steps, "lr": cfg.rm_learning_rate,
           "args": cfg.rm_args, "seed": cfg.seed, "v": 3}
    path = _cache_root(cfg) / f"reward_model-{config_fingerprint(key)}"

    def build(tmp: Path) -> None:
        train = _read_jsonl(data["train"])
        rng = random.Random(cfg.seed)
        rng.shuffle(train)
        n_policy = cfg.n_annotations // 2
        n_noisy = cfg.n_annotations - n_policy
        print(f"sampling {n_policy} summaries from the SFT policy (temperature 1) to annotate ...", flush=True)
        picked = train[:n_policy]
        samples = _generate_texts(sft, [r["prompt"] for r in picked], cfg.response_length, True, cfg.seed)
        # The noisy half has many more wrong facts than the SFT data (and some repeated clauses): a reward model
        # trained mostly on near-correct summaries learns to quote the *post's* facts instead of checking the
        # response's (measured: 81 % unmatched quotes, poor-token recall 0.5 % with the SFT data's noise rates).
        hard = TaskConfig(p_omit=0.1, p_wrong=cfg.rm_p_wrong, p_distractor=0.6)
        to_annotate = [
            {"id": f"policy-{r['id']}", "prompt": r["prompt"], "response": s} for r, s in zip(picked, samples)
        ] + [{"id": f"noisy-{r['id']}", "prompt": r["prompt"], "response": noisy_summary(rng, r["facts"], hard, p_repeat=0.2)}
             for r in train[n_policy : n_policy + n_noisy]]
        rng.shuffle(to_annotate)
        from text2grad.core.data import write_jsonl

        write_jsonl(tmp / "to_annotate.jsonl", to_annotate)
        kwargs = cfg.critic_kwargs if cfg.critic_kwargs is not None else {"data_path": str(data["train"])}
        _call("annotation.cli", [
            "--input", str(tmp / "to_annotate.jsonl"), "--output", str(tmp / "annotations.jsonl"),
            "--critic", cfg.critic, "--critic_kwargs", json.dumps(kwargs),
            "--field_map", json.dumps({"prompt": "prompt", "response": "response"}), *cfg.annotation_args,
        ])
        annotations = _read_jsonl(tmp / "annotations.jsonl")
        n_eval = max(8, len(annotations) // 10)
        write_jsonl(tmp / "rm_train.jsonl", annotations[n_eval:])
        write_jsonl(tmp / "rm_eval.jsonl", annotations[:n_eval])
        stages.start("reward model", f"{len(annotations) - n_eval} training / {n_eval} held-out annotations")
        _call("reward_model.train", [
            "--model_name_or_path", cfg.rm_base_model or str(rm_base), "--train_file", str(tmp / "rm_train.jsonl"),
            "--output_dir", str(tmp / "model"), "--use_lora", "false", "--instruction", RM_INSTRUCTION,
            "--prompt_format", "plain", "--max_length", "384", "--max_steps", str(cfg.rm_steps),
            "--learning_rate", str(cfg.rm_learning_rate), "--warmup_ratio", "0.05",
            "--per_device_train_batch_size", "16", "--logging_steps", str(max(1, cfg.rm_steps // 10)),
            "--save_steps", str(10 ** 9), "--seed", str(cfg.seed), *cfg.rm_args,
        ])
        _drop_checkpoints(tmp / "model")
        # as PPO will query it (eval/), and, when grounded, also free (eval-free/: how often it quotes exactly)
        for grounded, name in ((cfg.grounded_spans, "eval"), (False, "eval-free"))[: 1 + cfg.grounded_spans]:
            _call("reward_model.evaluate", [
                "--model_name_or_path", str(tmp / "model"), "--eval_file", str(tmp / "rm_eval.jsonl"),
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


def stage_ppo(cfg: QuickstartConfig, data: dict[str, Path], sft: Path, rm: Path, out: Path, mode: str,
              eval_fn: Callable[[Path], dict[str, float]]) -> tuple[Path, list[dict[str, Any]]]:
    """Policy optimization in ``mode``, in chunks of ``eval_every`` iterations; eval after each chunk."""
    run_dir = out / f"ppo-{mode}"
    base = [
        "--model_name_or_path", str(sft), "--dataset_path", str(data["rl"]), "--prompt_template", "{prompt}",
        *_ppo_feedback_args(cfg, data, rm),
        "--reward_mode", mode, "--use_lora", "false", "--output_dir", str(run_dir),
        "--batch_size", str(cfg.ppo_batch_size), "--num_mini_batches", "2", "--num_ppo_epochs", "2",
        "--learning_rate", str(cfg.ppo_learning_rate), "--lr_scheduler_type", "constant",
        "--kl_coef", str(cfg.kl_coef), "--adaptive_kl", "false", "--response_length", str(cfg.response_length),
        "--temperature", "0.7", "--vf_coef", "0.1", "--save_steps", "0", "--save_total_limit", "1",
        # a quote labels only its first occurrence: repeating a praised phrase must not pay
        "--occurrence", "first",
        "--seed", str(cfg.ppo_seed), "--log_samples", str(cfg.ppo_batch_size),  # every rollout, for the report
    ]
    curve = [{"iteration": 0, **eval_fn(sft)}]
    done = 0
    while done < cfg.ppo_iterations:
        done = min(cfg.ppo_iterations, done + cfg.eval_every)
        resume = ["--resume", "auto"] if curve[-1]["iteration"] > 0 else ["--overwrite_output_dir", "true"]
        _call("policy_optimization.train", base + ["--num_iterations", str(done), *resume, *cfg.ppo_args])
        reached = max((r["iteration"] for r in _read_jsonl(run_dir / "metrics.jsonl")), default=0)
        if reached < done:  # the trainer stops gracefully on Ctrl-C/SIGTERM; so does the quickstart
            raise RuntimeError(f"policy optimization ({mode}) stopped at iteration {reached} of {done}; "
                               f"rerun the same command to start over")
        curve.append({"iteration": done, **eval_fn(run_dir / "policy")})
        print(f"[{mode}] iteration {done}: eval fact_score {curve[-1]['fact_score']:.3f}", flush=True)
    (run_dir / "eval_curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    return run_dir / "policy", curve


def _ppo_feedback_args(cfg: QuickstartConfig, data: dict[str, Path], rm: Path) -> list[str]:
    if cfg.ppo_feedback == "critic":
        kwargs = cfg.critic_kwargs if cfg.critic_kwargs is not None else {"data_path": str(data["rl"])}
        return ["--feedback_source", cfg.critic, "--feedback_source_kwargs", json.dumps(kwargs)]
    return ["--feedback_source", "reward_model",
            "--feedback_source_kwargs",
            json.dumps({"path": str(rm), "max_new_tokens": 128, "batch_size": 64, "grounded_spans": cfg.grounded_spans})]


def evaluate_policy(model_path: Path, records: list[dict[str, Any]], max_new_tokens: int) -> tuple[dict[str, float], list[str]]:
    """Greedy summaries of the eval posts, scored by fact accuracy, ROUGE and BLEU against the references."""
    from text2grad.apps.evaluation.summarization import bleu, rouge_scores

    preds = _generate_texts(model_path, [r["prompt"] for r in records], max_new_tokens, False, 0)
    refs = [r["reference"].strip() for r in records]
    scores = dict(fact_accuracy(records, preds))
    rouge = rouge_scores([p.strip() for p in preds], refs)
    scores.update({k: float(v) for k, v in rouge.items()})
    scores["bleu"] = float(bleu([p.strip() for p in preds], refs))
    return scores, preds


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def run(cfg: QuickstartConfig) -> dict[str, Any]:
    """Run every stage; returns the summary written to ``output_dir/results.json``."""
    import torch

    from text2grad.core.config import save_config

    cfg = resolve(cfg)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "quickstart_config.yaml")
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# The phase commands this quickstart ran, in order.\n")
    _COMMAND_LOG[:] = [out / "commands.sh"]
    stages = _Stages(STAGES)
    print(f"Text2Grad quickstart (preset {cfg.preset}, seed {cfg.seed}) -> {out}", flush=True)

    stages.start("task data", "generated fact-summary posts with distractors")
    data = stage_data(cfg, out)
    eval_records = _read_jsonl(data["eval"])

    stages.start("policy (tokenizer, tiny Llama, SFT)", "cached after the first run")
    sft, rm_base = stage_policy(cfg, data)

    stages.start("annotation", f"critic {cfg.critic}")
    rm, rm_report = stage_reward_model(cfg, data, sft, rm_base, out, stages)

    stages.start("policy optimization", " vs ".join(cfg.modes))
    evals: dict[str, dict[str, float]] = {}
    preds: dict[str, list[str]] = {}

    def eval_fn(path: Path) -> dict[str, float]:
        # The SFT policy never changes (evaluated once); a PPO policy dir is rewritten after every chunk.
        key = str(Path(path).resolve())
        if key not in evals or key != str(Path(sft).resolve()):
            evals[key], preds[key] = evaluate_policy(Path(path), eval_records, cfg.response_length)
        return evals[key]

    policies: dict[str, Path] = {"sft": sft}
    curves: dict[str, list[dict[str, Any]]] = {}
    for mode in cfg.modes:
        policies[mode], curves[mode] = stage_ppo(cfg, data, sft, rm, out, mode, eval_fn)

    stages.start("evaluation", "greedy summaries of the eval split (final policies, evaluated after their last chunk)")
    results = {name: evals[str(Path(path).resolve())] for name, path in policies.items()}
    predictions = {name: preds[str(Path(path).resolve())] for name, path in policies.items()}
    print(results_table(results))
    from text2grad.core.data import write_jsonl

    write_jsonl(out / "eval_predictions.jsonl", [
        {"id": r["id"], "reference": r["reference"], **{name: predictions[name][i] for name in predictions}}
        for i, r in enumerate(eval_records)
    ])

    stages.start("report", "curves.png and index.html")
    from text2grad.apps.quickstart.report import write_report

    report = write_report(
        out / "report", eval_records=eval_records, policies=policies, curves=curves,
        metrics_files={m: out / f"ppo-{m}" / "metrics.jsonl" for m in cfg.modes}, reward_model=rm,
        results=results, rm_report=rm_report, n_samples=cfg.n_report_samples, response_length=cfg.response_length,
        seed=cfg.seed, grounded_spans=cfg.grounded_spans,
    )
    stages.finish()
    summary = {
        "config": asdict(cfg), "results": results, "curves": curves, "reward_model_eval": rm_report,
        "logprob_shift": report["logprob_shift"], "stage_seconds": stages.times,
        "total_seconds": time.perf_counter() - stages.start_all, "png": str(report["png"]), "html": str(report["html"]),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    print_results(summary)
    return summary


def results_table(results: dict[str, dict[str, float]]) -> str:
    """Markdown table of the final evaluation, one row per policy."""
    cols = ["fact_score", "fact_recall", "n_false", "perfect", "rouge1", "rouge2", "rougeL", "bleu"]
    cols = [c for c in cols if all(c in r for r in results.values())]
    names = {"sft": "SFT policy", "scalar": "scalar PPO", "nl_gradient": "Text2Grad (NL-gradient PPO)",
             "dense": "dense PPO", "mixed": "mixed PPO"}
    lines = ["| policy | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, r in results.items():
        lines.append(f"| {names.get(name, name)} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)


def print_results(summary: dict[str, Any]) -> None:
    print(f"\n{'=' * 100}\nResults on {summary['config']['n_eval']} eval posts (greedy decoding)\n{'=' * 100}")
    print(results_table(summary["results"]))
    rm = summary.get("reward_model_eval") or {}
    flat = _flatten(rm)
    keys = [k for k in flat if any(s in k for s in ("json_valid", "unmatched", "token_f1", "token_precision", "token_recall"))]
    if keys:
        print("\nreward model (held-out annotations): " + ", ".join(f"{k} {flat[k]:.3f}" for k in keys[:8]))
    shift = summary.get("logprob_shift") or {}
    if shift:
        print("mean change of token log-prob after Text2Grad, by the reward model's label: "
              + ", ".join(f"{k} {v:+.3f}" for k, v in shift.items()))
    print(f"\ntotal time {summary['total_seconds']:.0f} s; stages: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in summary["stage_seconds"].items()))
    print(f"curves: {summary['png']}\nreport: {summary['html']}")


def _flatten(d: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}." if not isinstance(v, (int, float)) else f"{prefix}{k}"))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
        out[prefix.rstrip(".")] = float(d)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from text2grad.core.config import parse_config

    cfg = parse_config(QuickstartConfig, argv)
    try:
        run(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"quickstart: error: {exc}", file=sys.stderr)
        return 2
    return 0
