"""What a quickstart run measured, how it is printed, and which installed versions produced it.

Shared by the pipeline (`text2grad.apps.quickstart.pipeline`) and the report (`text2grad.apps.quickstart.report`),
so neither imports the other.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from text2grad.apps.evaluation.summarization import bleu, rouge_scores
from text2grad.apps.quickstart.task import fact_accuracy
from text2grad.core.data import iter_jsonl
from text2grad.core.generation import Generation, apply_chat_template, generate
from text2grad.core.modeling import load_causal_lm, load_tokenizer

__all__ = [
    "KEY_PACKAGES",
    "LOCK_FILE",
    "generate_responses",
    "policy_prompts",
    "evaluate_policy",
    "PolicyEvaluator",
    "StageClock",
    "cpu_name",
    "describe_speed",
    "installed_versions",
    "machine_speed",
    "peak_rss_mb",
    "read_lock",
    "results_table",
    "print_results",
    "flatten",
]

# The lock (constraints) file env.sh installs with by default (see env.sh and README "Reproducible installs").
LOCK_FILE = Path(__file__).resolve().parents[3] / "constraints.txt"
# Packages whose versions change the quickstart's numbers (numerics, tokenization, data order, metrics).
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "numpy", "safetensors", "peft", "datasets",
                "rouge-score", "sacrebleu", "deepspeed", "trl")


def generate_responses(model_path: Path, prompts: list[str], max_new_tokens: int, do_sample: bool, seed: int,
                       batch_size: int = 64, use_chat_template: bool = False) -> list[Generation]:
    """Summaries of ``prompts`` by the policy at ``model_path``, with their exact token ids.

    ``use_chat_template``: each prompt is the user turn of the tokenizer's chat template (as PPO renders it with
    ``--use_chat_template true``), tokenized without adding special tokens again (`policy_prompts`)."""
    tokenizer = load_tokenizer(str(model_path))
    model = load_causal_lm(str(model_path)).eval()
    prompts, add_special_tokens = policy_prompts(tokenizer, prompts, use_chat_template)
    torch.manual_seed(seed)
    return generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                    do_sample=do_sample, temperature=1.0, progress_bar=True, add_special_tokens=add_special_tokens)


def policy_prompts(tokenizer, prompts: list[str], use_chat_template: bool) -> tuple[list[str], bool | None]:
    """The policy's prompt texts and the ``add_special_tokens`` to tokenize them with, by the special tokens rule of
    `text2grad.core.generation`: rendered by the chat template -> False (the template wrote every special token;
    no second BOS); plain -> None (the rule per prompt). Without a template on the tokenizer the prompts stay plain,
    as policy_optimization.train does."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return [apply_chat_template(tokenizer, p) for p in prompts], False
    return list(prompts), None


def machine_speed(size: int = 256, repeats: int = 7, min_seconds: float = 0.15) -> dict[str, Any]:
    """This machine's speed on a fixed small fp32 matmul, so a quickstart time from one machine can be compared
    with another's: a machine with half the GFLOP/s should take about twice as long.

    Times ``size x size @ size x size`` with torch's current thread count, ``repeats`` batches of at least
    ``min_seconds`` each, and reports the median batch (robust to one interrupted batch).
    """
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    b = torch.randn(size, size, generator=torch.Generator().manual_seed(1))
    a @ b  # first call: thread pool start-up and allocation, not speed
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:  # calls per batch, so that a batch lasts ~min_seconds
        a @ b
        n += 1
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            a @ b
        rates.append(2 * size**3 * n / (time.perf_counter() - t0) / 1e9)
    return {"matmul_gflops": round(statistics.median(rates), 2), "matmul_size": size, "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "cpu": cpu_name(), "load_average_1min": _load_average(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}


def peak_rss_mb() -> float:
    """The highest resident memory so far of this process or any finished child process (the side-by-side PPO runs),
    in MB (``ru_maxrss``: KiB on Linux, bytes on macOS).

    The quickstart prints it after every phase command and stage: the phase that raises it is where the peak is."""
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def describe_speed(speed: Mapping[str, Any]) -> str:
    """One line for the log: the matmul rate of :func:`machine_speed` and what it was measured with."""
    return (f"machine speed: {speed['matmul_gflops']:.1f} GFLOP/s ({speed['matmul_size']}x{speed['matmul_size']} fp32 "
            f"matmul, {speed['torch_threads']} torch threads, {speed['cpu_count']} cores, {speed['cpu']}; load average "
            f"{speed['load_average_1min']}, OMP_WAIT_POLICY {speed.get('omp_wait_policy')})")


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo; elsewhere what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def evaluate_policy(model_path: Path, records: list[dict[str, Any]], max_new_tokens: int,
                    use_chat_template: bool = False) -> tuple[dict[str, float], list[str]]:
    """Greedy summaries of the eval posts, scored by fact accuracy, ROUGE and BLEU against the references."""
    preds = [g.text for g in generate_responses(model_path, [r["prompt"] for r in records], max_new_tokens, False, 0,
                                                use_chat_template=use_chat_template)]
    refs = [r["reference"].strip() for r in records]
    scores = dict(fact_accuracy(records, preds))
    rouge = rouge_scores([p.strip() for p in preds], refs)
    scores.update({k: float(v) for k, v in rouge.items()})
    scores["bleu"] = float(bleu([p.strip() for p in preds], refs))
    return scores, preds


@dataclass
class PolicyEvaluator:
    """``evaluator(policy, records)``: `evaluate_policy` on ``records``, or on the eval split when ``records`` is empty.

    The SFT policy's results are computed once per split and kept in ``sft_results``; the object is picklable, so
    PPO runs in other processes reuse what the parent computed."""

    sft: Path
    eval_records: list[dict[str, Any]]
    max_new_tokens: int
    use_chat_template: bool = False
    sft_results: dict[str, tuple[dict[str, float], list[str]]] = field(default_factory=dict)

    def __call__(self, policy: Path, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[str]]:
        split = "val" if records else "eval"
        if Path(policy) == Path(self.sft) and split in self.sft_results:
            return self.sft_results[split]
        got = evaluate_policy(Path(policy), records or self.eval_records, self.max_new_tokens,
                              use_chat_template=self.use_chat_template)
        if Path(policy) == Path(self.sft):
            self.sft_results[split] = got
        return got


class StageClock:
    """Numbered stage headers; the time each stage took and the peak RSS at its end (`peak_rss_mb`)."""

    def __init__(self, names: Sequence[str]):
        self.names, self.index, self.t0, self.times, self.peak_rss_mb = list(names), 0, None, {}, {}
        self.start_all = time.perf_counter()

    def start(self, name: str, note: str = "") -> None:
        self.finish()
        self.index = self.names.index(name) + 1
        self.current, self.t0 = name, time.perf_counter()
        line = f"[{self.index}/{len(self.names)}] {name}" + (f" - {note}" if note else "")
        print(f"\n{'=' * 100}\n{line}\n{'=' * 100}", flush=True)

    def finish(self) -> None:
        if self.t0 is not None:
            seconds, peak = time.perf_counter() - self.t0, peak_rss_mb()
            self.times[self.current], self.peak_rss_mb[self.current] = seconds, peak
            print(f"--- {self.current}: {seconds:.1f} s (peak RSS so far {peak:.0f} MB)", flush=True)
            self.t0 = None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines of a constraints file ({} if absent)."""
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_normalize(name.strip())] = version.strip()
    return pins


def installed_versions(lock: Path = LOCK_FILE) -> dict[str, Any]:
    """The Python, platform and package versions of this process, and how they compare with the lock file.

    ``environment_sha256`` hashes every installed ``name==version`` (sorted), so two results files with the
    same value came from the same set of packages; ``differs_from_lock`` lists ``{name: [installed, locked]}``
    for locked packages installed at another version (torch is pinned by env.sh's TORCH_SPEC, not the lock, so
    its local build label such as ``+cpu`` is ignored) and ``missing_from_lock`` installed packages the lock
    does not pin (the project itself excluded).
    """
    dists = {}
    for dist in metadata.distributions():  # in sys.path order: the first one of a name is the one Python imports
        name = dist.metadata["Name"]
        # a later copy is shadowed, e.g. the packaging / typing_extensions that setuptools vendors in
        # setuptools/_vendor, which lands on sys.path once setuptools is imported
        if name and _normalize(name) not in dists:
            dists[_normalize(name)] = dist.version
    pins = read_lock(lock)
    differs = {}
    for name, locked in pins.items():
        have = dists.get(name)
        if have is not None and have != locked and have.split("+")[0] != locked:
            differs[name] = [have, locked]
    missing = sorted(n for n in dists if n not in pins and n not in ("text2grad", "torch"))
    frozen = "\n".join(f"{n}=={v}" for n, v in sorted(dists.items()) if n != "text2grad")
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {name: dists.get(_normalize(name)) for name in KEY_PACKAGES},
        "environment_sha256": hashlib.sha256(frozen.encode()).hexdigest()[:16],
        "lock_file": str(lock.name) if lock.is_file() else None,
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest()[:16] if lock.is_file() else None,
        "differs_from_lock": differs,
        "missing_from_lock": missing,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


_NAMES = {"sft": "SFT policy", "scalar": "scalar PPO", "nl_gradient": "Text2Grad (NL-gradient PPO)",
          "dense": "dense PPO", "score_spread": "score-spread PPO", "mixed": "mixed PPO"}


def feedback_error_rates(metrics_files: Mapping[str, Path]) -> dict[str, list[float]]:
    """Per mode, the share of each PPO iteration's samples whose feedback failed: the quantity PPO's
    max_feedback_error_rate guard compares (failed feedback on a non-empty response, or a failed score)."""
    rates = {}
    for mode, path in metrics_files.items():
        rows = [r for r in (iter_jsonl(path) if Path(path).is_file() else []) if r.get("samples/batch")]
        rates[mode] = [(r.get("samples/feedback_error", 0.0) + r.get("samples/score_error", 0.0)) / r["samples/batch"]
                       for r in rows]
    return rates


def describe_feedback_errors(rates: Mapping[str, Sequence[float]], guard: float | None) -> str:
    """One sentence on how often the reward model's feedback failed during PPO, and whether the guard was on."""
    worst = max((max(r) for r in rates.values() if r), default=0.0)
    n_bad = sum(sum(x > 0 for x in r) for r in rates.values())
    n_all = sum(len(r) for r in rates.values())
    guard_text = ("the guard was off (max_feedback_error_rate 1.0: a failed sample gets zero reward)" if guard is not None
                  and guard >= 1 else f"PPO stops above max_feedback_error_rate {guard}")
    return (f"feedback failed in {n_bad} of {n_all} PPO iterations (worst iteration {worst:.0%} of its samples); "
            f"{guard_text}")


def start_policy_name(config: Mapping[str, Any]) -> str:
    """How the tables and the report name the policy PPO starts from (results key ``"sft"``): "SFT policy" when the
    run fine-tuned it, else the model it was given as ``sft_model``, e.g. "start policy (SmolLM2-135M-Instruct)"."""
    given = config.get("sft_model")
    if not given:
        return _NAMES["sft"]
    name = Path(str(given)).name
    if name.lower().startswith("smollm2-135m-instruct"):  # the converted asset's folder carries a version suffix
        name = "SmolLM2-135M-Instruct"
    return f"start policy ({name})"


def results_table(results: Mapping[str, Mapping[str, float]], start_name: str = _NAMES["sft"]) -> str:
    """Markdown table of the final evaluation, one row per policy; ``start_name`` names the ``"sft"`` row
    (`start_policy_name`)."""
    cols = ["fact_score", "fact_recall", "n_false", "perfect", "rouge1", "rouge2", "rougeL", "bleu"]
    cols = [c for c in cols if all(c in r for r in results.values())]
    lines = ["| policy | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, r in results.items():
        lines.append(f"| {start_name if name == 'sft' else _NAMES.get(name, name)} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)


def print_results(summary: Mapping[str, Any]) -> None:
    print(f"\n{'=' * 100}\nResults on {summary['config']['n_eval']} eval posts (greedy decoding)\n{'=' * 100}")
    print(results_table(summary["results"], start_policy_name(summary.get("config") or {})))
    if summary.get("feedback_error_rate"):
        print(describe_feedback_errors(summary["feedback_error_rate"], summary.get("max_feedback_error_rate")))
    flat = flatten(summary.get("reward_model_eval") or {})
    keys = [k for k in flat if any(s in k for s in ("json_valid", "unmatched", "token_f1", "token_precision", "token_recall"))]
    if keys:
        print("\nreward model (held-out annotations): " + ", ".join(f"{k} {flat[k]:.3f}" for k in keys[:8]))
    shift = summary.get("logprob_shift") or {}
    if shift:
        print("mean change of token log-prob after Text2Grad, by the reward model's label: "
              + ", ".join(f"{k} {v:+.3f}" for k, v in shift.items()))
    true_shift = summary.get("logprob_shift_true") or {}
    if true_shift:
        print("... by the critic's true label: " + ", ".join(f"{k} {v:+.3f}" for k, v in true_shift.items()))
    for sentence in summary.get("interpretation") or []:
        print(f"- {sentence}")
    versions = summary.get("versions") or {}
    if versions:
        pk = versions["packages"]
        print(f"\ninstalled: python {versions['python']}, torch {pk.get('torch')}, transformers {pk.get('transformers')}, "
              f"tokenizers {pk.get('tokenizers')}; environment {versions['environment_sha256']}; "
              + (f"differs from {versions['lock_file']}: {versions['differs_from_lock']}" if versions["differs_from_lock"]
                 else f"matches {versions['lock_file']}" if versions["lock_file"] else "no lock file"))
    print(f"\ntotal time {summary['total_seconds']:.0f} s; stages: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in summary["stage_seconds"].items()))
    if summary.get("machine_speed"):
        print(describe_speed(summary["machine_speed"]))
    print(f"curves: {summary['png']}\nreport: {summary['html']}")


def flatten(d: Any, prefix: str = "") -> dict[str, float]:
    """Finite numbers of a nested dict as ``{"a.b.c": value}``."""
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}." if not isinstance(v, (int, float)) else f"{prefix}{k}"))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
        out[prefix.rstrip(".")] = float(d)
    return out
