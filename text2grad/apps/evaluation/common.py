"""Pieces every evaluation suite shares: loading a policy, scoring continuations, writing reports.

- `load_policy` loads a checkpoint the way users name it: a hub id, a local directory, a base model plus a
  LoRA adapter, or a directory that holds only an adapter (its base comes from adapter_config.json).
- `continuation_logprobs` gives the summed log-probability of each continuation given its context; the
  summarization suite turns it into reference perplexity and the QA suite into ARC answer scores.
- `write_report` writes ``<name>.json`` (everything) and ``<name>.md`` (a Markdown table for papers/READMEs).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from text2grad.core.cli import EXIT_OK
from text2grad.core.cli import run_cli as run_shared_cli
from text2grad.core.config import ConfigError
from text2grad.core.data import write_whole
from text2grad.core.generation_backend import TextGenerator, load_text_generator
from text2grad.core.placement import check_device

__all__ = [
    "load_policy",
    "load_generator",
    "pick_device",
    "ContinuationScore",
    "continuation_logprobs",
    "write_report",
    "markdown_table",
    "format_value",
]


def pick_device(device: str | None = None) -> str:
    """``device`` if given (a ``cuda:N`` this process cannot see is refused: `check_device`), else "cuda" when a
    GPU is visible, else "cpu"."""
    if device:
        check_device(device)
        return device

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_policy(model: str, adapter: str | None = None, dtype: str | None = "auto", device: str | None = None):
    """Load a policy for evaluation and return ``(model, tokenizer)``, the model in eval mode on ``device``.

    Args:
        model: hub id or local directory of the base model, or a directory holding only a LoRA adapter.
        adapter: optional LoRA adapter directory applied on top of ``model`` (merged for speed).
        dtype: "auto", "bf16", "fp16" or "fp32".
        device: "cpu", "cuda", "cuda:1", ...; default: a GPU if visible.

    The tokenizer comes from the adapter directory when it holds one (training scripts save the tokenizer
    next to the adapter, possibly with added tokens), else from the base model
    (`text2grad.core.generation_backend.resolve_model_source`).
    """
    generator = load_text_generator("hf", model, adapter, dtype=dtype, device=pick_device(device))
    return generator.model, generator.tokenizer


def load_generator(cfg: Any) -> TextGenerator:
    """The generator an evaluation config asks for: its ``model`` (+ ``adapter``) on its ``generation_backend``
    (``dtype``, ``device``, ``vllm_kwargs``). A missing vllm is a usage error (exit 2) raised before any model
    loads."""
    try:
        return load_text_generator(
            cfg.generation_backend, cfg.model, cfg.adapter, dtype=cfg.dtype, device=pick_device(cfg.device),
            vllm_kwargs=cfg.vllm_kwargs,
        )
    except ImportError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class ContinuationScore:
    """Log-likelihood of one continuation.

    Attributes:
        logprob: sum over the continuation's tokens of log p(token | context, earlier tokens), natural log.
        num_tokens: how many continuation tokens were scored.
        truncated: True if the context or the continuation was cut to fit ``max_length``.
    """

    logprob: float
    num_tokens: int
    truncated: bool = False

    @property
    def mean_logprob(self) -> float:
        """Length-normalized log-likelihood (per token); -inf for an empty continuation."""
        return self.logprob / self.num_tokens if self.num_tokens else float("-inf")


def continuation_logprobs(
    model,
    tokenizer,
    contexts: Sequence[str],
    continuations: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    add_special_tokens: bool = True,
    progress_bar: bool = False,
) -> list[ContinuationScore]:
    """Score ``continuations[i]`` given ``contexts[i]`` under a causal LM, in batches, in input order.

    The context is tokenized with the tokenizer's special tokens (BOS) and the continuation without, and the
    ids are concatenated, so exactly the continuation's own tokens are scored (no re-tokenization of the
    joined string moves the boundary). Put the separating space at the start of the continuation
    (``" Paris"``), as a model would generate it. An empty context is replaced by BOS when the tokenizer has
    one; otherwise the first continuation token has nothing to condition on and is not scored.
    ``max_length`` cuts the context from the left, then the continuation from the right. Pass
    ``add_special_tokens=False`` for contexts that already hold BOS (chat-templated prompts).

    Rows are left-padded so every continuation ends at the last column; only the last
    ``max continuation length + 1`` positions' logits are computed (``logits_to_keep``), which keeps memory
    at (B, K, V) instead of (B, T, V) for long prompts and large vocabularies.
    """
    if len(contexts) != len(continuations):
        raise ValueError(f"got {len(contexts)} contexts but {len(continuations)} continuations; pass one of each per item")
    if not contexts:
        return []
    ctx_ids = tokenizer(list(contexts), add_special_tokens=add_special_tokens)["input_ids"]
    cont_ids = tokenizer(list(continuations), add_special_tokens=False)["input_ids"]
    items: list[tuple[list[int], int, bool]] = []  # (ids, number of scored tokens at the end, truncated)
    for ctx, cont in zip(ctx_ids, cont_ids):
        ctx, cont, truncated = list(ctx), list(cont), False
        if not ctx and tokenizer.bos_token_id is not None:
            ctx = [tokenizer.bos_token_id]
        if max_length is not None and len(ctx) + len(cont) > max_length:
            truncated = True
            cont = cont[: max_length - 1]  # keep at least one context token to condition on
            ctx = ctx[len(ctx) - (max_length - len(cont)) :]
        scored = len(cont) if ctx else max(len(cont) - 1, 0)
        items.append((ctx + cont, scored, truncated))

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))  # similar lengths together: less padding
    results: dict[int, ContinuationScore] = {}
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if progress_bar:
        batches = tqdm(batches, desc="log-likelihood", unit="batch")
    with torch.no_grad():
        for batch in batches:
            scorable = [i for i in batch if items[i][1] > 0]
            for i in batch:
                if items[i][1] == 0:
                    results[i] = ContinuationScore(0.0, 0, items[i][2])
            if not scorable:
                continue
            width = max(len(items[i][0]) for i in scorable)
            k = max(items[i][1] for i in scorable)
            input_ids = torch.full((len(scorable), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(scorable), width), dtype=torch.long)
            for row, i in enumerate(scorable):
                ids = items[i][0]
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                mask[row, width - len(ids) :] = 1
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            input_ids, mask, position_ids = input_ids.to(device), mask.to(device), position_ids.to(device)
            logits = _last_logits(model, input_ids, mask, position_ids, k + 1)  # (B, k+1, V)
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, k, V): predicts the last k tokens
            targets = input_ids[:, -k:]  # (B, k)
            token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, k)
            for row, i in enumerate(scorable):
                n = items[i][1]
                results[i] = ContinuationScore(float(token_logp[row, k - n :].sum()), n, items[i][2])
    return [results[i] for i in range(len(items))]


def _last_logits(model, input_ids, attention_mask, position_ids, keep: int):
    """Logits of the last ``keep`` positions, (B, keep, V); computes only those where the model allows it."""
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=keep)
    except TypeError:  # architectures without logits_to_keep: compute all, then slice
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.logits[:, -keep:]


def format_value(value: Any) -> str:
    """A table cell: floats with 4 significant decimals, None as "-", everything else via str()."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table; columns default to the keys of all rows in first-seen order."""
    if not rows:
        return "_(no rows)_\n"
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_value(row.get(col)) for col in columns) + " |")
    return "\n".join(lines) + "\n"


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON; write them as null (the Markdown shows them as nan/inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_report(
    output_dir: str | Path,
    name: str,
    results: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    title: str | None = None,
) -> tuple[Path, Path]:
    """Write ``<output_dir>/<name>.json`` and ``<output_dir>/<name>.md``; return both paths.

    The JSON holds ``{"name", "created", "results", "rows"}`` (non-finite floats become null). The Markdown
    holds a title, ``rows`` as a table, and ``results["notes"]`` (a string or a list of strings) as bullet
    points, which is where a suite says things a reader must know (e.g. which BERTScore model was used, or
    that a win rate is raw and not length-controlled).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = output_dir / f"{name}.json", output_dir / f"{name}.md"
    payload = {
        "name": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "results": _json_safe(dict(results)),
        "rows": _json_safe([dict(r) for r in rows]),
    }
    write_whole(json_path, json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    notes = results.get("notes") or []
    notes = [notes] if isinstance(notes, str) else list(notes)
    md = f"# {title or name}\n\n" + markdown_table(rows)
    if notes:
        md += "\n" + "".join(f"- {note}\n" for note in notes)
    md_path.write_text(md, encoding="utf-8")
    return json_path, md_path


def run_cli(config_cls: type, evaluate: Callable[[Any], Mapping[str, Any]], argv: Sequence[str] | None) -> int:
    """The shared ``main`` of every evaluation entry point: parse the config, evaluate, print the report.

    Bad configs, data or paths exit with code 2 and a one-line message; the report's Markdown is printed
    and every ``*_json`` / ``*_md`` path in the results is listed.
    """

    def run(cfg: Any) -> int:
        try:
            results = evaluate(cfg)
        except ValueError as exc:  # a bad setting found while evaluating (ConfigError and DataError among them)
            raise ConfigError(str(exc)) from None
        print(Path(results["report_md"]).read_text(encoding="utf-8"))
        written = [str(v) for k, v in results.items() if k.endswith(("_json", "_md")) and isinstance(v, str)]
        print("wrote " + ", ".join(written))
        return EXIT_OK

    return run_shared_cli(config_cls, run, argv)
