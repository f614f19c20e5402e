"""SLF5K (``JeremyAlain/SLF5K``): Reddit posts, a model summary with human feedback, an ideal human summary,
and a human comparison of two more summaries.

- annotation_input.jsonl (train): ``prompt`` = the post, ``response`` = ``generated_summary_for_feedback``, and
  the human ``feedback`` (the human-grounding critic's critique), with title / subreddit / feedback_class;
- sft.jsonl (train): the policy ``prompt`` and ``completion`` = " " + ``ideal_human_summary``;
- rl_prompts.jsonl (train): ``prompt``, title, post and ``reference`` (the ideal human summary);
- eval.jsonl (``eval_split``, default validation): the native columns plus ``prompt`` and ``reference``;
- preference_pairs.jsonl (train): ``chosen`` / ``rejected`` from ``generated_summary_for_comparison_A/B`` as
  ``comparison_preference`` ("Summary A" / "Summary B") says; rows with another value are skipped and counted.

Completions, chosen and rejected are continuations of the prompt (they start with a space after "TL;DR:").
"""

from __future__ import annotations

from typing import Any

from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.prepare_data.sources import SchemaError, check_columns, load_split
from text2grad.core.data import render_template

SPLITS = ("train", "development", "validation", "test")
COLUMNS = (
    "id", "subreddit", "title", "post", "summary_prompt", "generated_summary_for_feedback", "feedback",
    "feedback_class", "ideal_human_summary", "generated_summary_for_comparison_A",
    "generated_summary_for_comparison_B", "comparison_preference",
)
# What each output needs; a split only has to have the columns its outputs use.
TRAIN_COLUMNS = ("id", "title", "post", "generated_summary_for_feedback", "feedback", "ideal_human_summary",
                 "generated_summary_for_comparison_A", "generated_summary_for_comparison_B", "comparison_preference")
EVAL_COLUMNS = ("id", "title", "post", "ideal_human_summary")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def prepare(cfg: PrepareDataConfig) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    eval_split = cfg.eval_split or "validation"
    if eval_split not in SPLITS:
        raise SchemaError(f"slf5k: eval_split {eval_split!r} is not an SLF5K split; choose one of {list(SPLITS)}")
    train = load_split("slf5k", cfg.dataset_path, "train", "train", cfg.max_samples)
    check_columns(train, TRAIN_COLUMNS)
    held_out = load_split("slf5k", cfg.dataset_path, eval_split, "train", cfg.max_samples)
    check_columns(held_out, EVAL_COLUMNS)

    def prompt(row: dict[str, Any]) -> str:
        return render_template(cfg.slf5k_prompt_template, row, where=str(row.get("id")))

    annotation, sft, rl, pairs = [], [], [], []
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for row in train.rows:
        rid, post = str(row["id"]), row["post"]
        context = {"id": rid, "title": row["title"], "subreddit": row.get("subreddit"), "post": post}
        summary, feedback = _text(row["generated_summary_for_feedback"]), _text(row["feedback"])
        if summary and feedback:
            annotation.append({"id": rid, "prompt": post, "response": summary, "feedback": feedback,
                               "feedback_class": row.get("feedback_class"), "title": row["title"],
                               "subreddit": row.get("subreddit")})
        else:
            skip("annotation: empty generated_summary_for_feedback or feedback")
        ideal = _text(row["ideal_human_summary"])
        if ideal:
            sft.append({**context, "prompt": prompt(row), "completion": " " + ideal.strip()})
            rl.append({**context, "prompt": prompt(row), "reference": ideal.strip()})
        else:
            skip("sft/rl: empty ideal_human_summary")
        a, b = _text(row["generated_summary_for_comparison_A"]), _text(row["generated_summary_for_comparison_B"])
        preference = row["comparison_preference"]
        if a and b and preference in ("Summary A", "Summary B"):
            chosen, rejected = (a, b) if preference == "Summary A" else (b, a)
            pairs.append({**context, "prompt": prompt(row), "chosen": " " + chosen.strip(),
                          "rejected": " " + rejected.strip(), "comparison_preference": preference})
        else:
            skip("preference_pairs: missing summary or comparison_preference not 'Summary A'/'Summary B'")
    eval_rows = [{**row, "id": str(row["id"]), "prompt": prompt(row), "reference": row["ideal_human_summary"]}
                 for row in held_out.rows if _text(row["ideal_human_summary"])]
    if len(eval_rows) < len(held_out.rows):
        skipped["eval: empty ideal_human_summary"] = len(held_out.rows) - len(eval_rows)
    files = {"annotation_input.jsonl": annotation, "sft.jsonl": sft, "rl_prompts.jsonl": rl,
             "eval.jsonl": eval_rows, "preference_pairs.jsonl": pairs}
    report = {
        "splits": {"train": {"rows": len(train.rows), "from": train.origin},
                   eval_split: {"rows": len(held_out.rows), "from": held_out.origin}},
        "eval_split": eval_split,
        "preference": {"Summary A": sum(p["comparison_preference"] == "Summary A" for p in pairs),
                       "Summary B": sum(p["comparison_preference"] == "Summary B" for p in pairs)},
        "skipped": skipped,
    }
    return files, report
