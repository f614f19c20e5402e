"""Evaluate a reward model on held-out annotations (the paper's Table 1 and Appendix C metrics).

    python -m reward_model.evaluate --model_name_or_path outputs/slf5k/reward_model \\
        --dataset_path outputs/slf5k/annotations/eval.jsonl --output_dir outputs/slf5k/rm_eval

For every (prompt, response) the model writes a critique and span JSON, which is compared with the
annotator's feedback by `reward_model.metrics`: JSON-validity rate, unmatched-span rate, token-level
precision / recall / F1 for positive, negative and neutral tokens, and span exact / partial match counts.
Writes ``report.json``, ``report.md`` and ``predictions.jsonl`` (one line per example: the reference, the
prediction, the raw output and the per-example counts) to ``output_dir``.

``--predictions_file`` scores saved critic outputs (e.g. an LLM critic's) instead of running a model:
a JSONL with ``id`` and either ``raw`` (the critic's text) or ``critique``/``good_spans``/``poor_spans``.

An ensemble directory (``reward_model.train --ensemble_size K``: ``member-0`` ... ``member-<K-1>``) is evaluated as
the ensemble critic PPO reads it (`reward_model.ensemble`): the report scores the quote-level consensus (a good
quote kept where ``--ensemble_min_votes`` members agree, default all of them; every member's poor quotes kept), and
``report.json``'s ``members`` holds each member's own metrics on the same examples.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from reward_model.ensemble import RewardModelEnsemble, member_paths
from reward_model.evaluate_config import EvalConfig
from reward_model.train_config import MEMBER_PREFIX
from reward_model.inference import GenerativeRewardModel
from reward_model.metrics import evaluate_feedback, format_markdown
from reward_model.serialization import parse_target, record_feedback, record_spans
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError, config_to_dict
from text2grad.core.data import DataError, iter_jsonl, load_records, record_id, write_jsonl
from text2grad.core.ensemble import EnsembleFeedback
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_tokenizer

__all__ = ["evaluate", "main"]

REQUIRED_FIELDS = ("prompt", "response", "critique", "good_spans", "poor_spans")


def _load_predictions(path: str, records: list[dict[str, Any]]) -> list[Feedback]:
    """Saved outputs, matched to records by id (or by position when they carry no id)."""
    rows = list(iter_jsonl(path))
    by_id = {str(r["id"]): r for r in rows if "id" in r}
    out = []
    for i, rec in enumerate(records):
        rid = record_id(rec, i)
        row = by_id.get(rid) if by_id else (rows[i] if i < len(rows) else None)
        if row is None:
            raise DataError(f"{path}: no prediction for record {rid!r}")
        if isinstance(row.get("raw"), str):
            parsed = parse_target(row["raw"])
            out.append(parsed.feedback if parsed.ok else Feedback.failed(parsed.error or "unparseable", raw=row["raw"]))
        else:
            out.append(Feedback.from_dict(row))
    return out


def is_ensemble_dir(path: str | None) -> bool:
    """Whether ``path`` is an ensemble directory (``member-<k>/`` inside, no model of its own)."""
    root = Path(path or "")
    own_model = (root / "config.json").is_file() or (root / "adapter_config.json").is_file()
    return root.is_dir() and not own_model and any(p.is_dir() for p in root.glob(f"{MEMBER_PREFIX}*"))


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Run the evaluation and write the report files. Returns the report dictionary."""
    if not cfg.dataset_path:
        raise ConfigError("dataset_path is required (held-out annotated records)")
    if not cfg.predictions_file and not cfg.model_name_or_path:
        raise ConfigError("pass --model_name_or_path (a reward model) or --predictions_file (saved critic outputs)")
    records = load_records(cfg.dataset_path, split=cfg.dataset_split, field_map=cfg.field_map, required=REQUIRED_FIELDS, limit=cfg.limit)
    prompts = [str(r["prompt"]) for r in records]
    responses = [str(r["response"]) for r in records]
    references = [record_feedback(r) for r in records]
    stats: dict[str, Any] = {}
    if cfg.predictions_file:
        predictions = _load_predictions(cfg.predictions_file, records)
        if not cfg.label_tokenizer:
            raise ConfigError("--predictions_file needs --label_tokenizer (the tokenizer to count tokens with)")
        label_tokenizer = load_tokenizer(cfg.label_tokenizer)
    else:
        overrides = {k: v for k, v in (("instruction", cfg.instruction), ("prompt_format", cfg.prompt_format)) if v}
        kwargs = dict(dtype=cfg.dtype, backend=cfg.backend, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
                      grounded_spans=cfg.grounded_spans, **overrides)
        ensemble = is_ensemble_dir(cfg.model_name_or_path)
        if ensemble and cfg.adapter:
            raise ConfigError(f"{cfg.model_name_or_path} is an ensemble directory (member-<k>/ inside): drop --adapter, "
                              "each member is loaded from its own folder")
        if ensemble:
            rm = RewardModelEnsemble.from_critic_kwargs(path=cfg.model_name_or_path, min_votes=cfg.ensemble_min_votes,
                                                        **kwargs)
        else:
            rm = GenerativeRewardModel.from_pretrained(cfg.model_name_or_path, adapter=cfg.adapter, **kwargs)
        predictions = []
        chunk = cfg.batch_size * 4  # several batches per progress step, so length-sorting still pays
        for start in tqdm(range(0, len(records), chunk), desc="reward model", unit="chunk"):
            predictions.extend(rm.feedback(prompts[start : start + chunk], responses[start : start + chunk]))
        stats = {} if ensemble else rm.stats.as_dict()
        if cfg.label_tokenizer:
            label_tokenizer = load_tokenizer(cfg.label_tokenizer)
        else:  # the members were trained from one base, so the first one's tokenizer is every member's
            label_tokenizer = load_tokenizer(member_paths(cfg.model_name_or_path)[0]) if ensemble else rm.tokenizer
    metrics, per_example = evaluate_feedback(
        predictions, references, responses, label_tokenizer, occurrence=cfg.occurrence, overlap=cfg.overlap,
        boundary=cfg.boundary, reference_spans=[record_spans(r) for r in records],
    )
    report = metrics.to_dict()
    if stats:
        report["generation"] = stats
    if predictions and all(isinstance(p, EnsembleFeedback) and p.members for p in predictions):
        report["members"] = [  # each member's own feedback on the same examples, scored the same way
            evaluate_feedback([p.members[k] for p in predictions], references, responses, label_tokenizer,
                              occurrence=cfg.occurrence, overlap=cfg.overlap, boundary=cfg.boundary,
                              reference_spans=[record_spans(r) for r in records])[0].to_dict()
            for k in range(len(predictions[0].members))
        ]
    report["config"] = config_to_dict(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    title = f"Reward model evaluation: {cfg.predictions_file or cfg.model_name_or_path} on {cfg.dataset_path}"
    (out / "report.md").write_text(format_markdown(report, title=title))
    write_jsonl(
        out / "predictions.jsonl",
        [
            {
                "id": record_id(rec, i),
                "response": resp,
                "reference": ref.to_dict(),
                "predicted": pred.to_dict(),
                "raw": pred.raw,
                "error": pred.error,
                **cmp.to_dict(),
            }
            for i, (rec, resp, ref, pred, cmp) in enumerate(zip(records, responses, references, predictions, per_example))
        ],
    )
    return report


def run_evaluation(cfg: EvalConfig) -> int:
    report = evaluate(cfg)
    print(format_markdown(report, title="Reward model evaluation"))
    print(f"report written to {cfg.output_dir}/report.json and report.md")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(EvalConfig, run_evaluation, argv)


if __name__ == "__main__":
    sys.exit(main())
