"""UltraFeedback binarized (``HuggingFaceH4/ultrafeedback_binarized``): prompts with a chosen and a rejected
conversation (lists of ``{role, content}`` messages); a response is the last assistant message.

``train_prefs`` is shared out by ``prompt_id`` (seeded, disjoint by prompt), the paper's 30 % SFT / 50 % reward
model / 20 % RL by default:

- sft.jsonl (SFT part): ``prompt`` and ``completion`` = the chosen response;
- annotation_input.jsonl (reward-model part): both responses of every pair, each its own record with a stable id
  ``<prompt_id>:chosen`` / ``<prompt_id>:rejected`` (a prompt_id seen again gets ``#2``, ``#3``, ... before the
  colon), with ``label`` and ``score``;
- preference_pairs.jsonl (reward-model part): ``prompt`` / ``chosen`` / ``rejected`` as text, with the scores;
- rl_prompts.jsonl (RL part): ``prompt`` and the chosen response as ``reference``;
- eval.jsonl (``test_prefs``): ``prompt`` / ``chosen`` / ``rejected`` as text.

Every pair and annotation record carries ``tie``: ``score_chosen == score_rejected`` (row 0 of ``train_prefs`` is
8.5 vs 8.5). A tie states no preference; ``drop_ties`` leaves such pairs out (before the split, and from
eval.jsonl), and the report counts them either way. ``eval_split train_prefs`` is refused: it is the training
split itself. Another eval split that shares prompts with the training pairs is reported (``eval_prompts_in_training``)
and warned about.
"""

from __future__ import annotations

import logging
from typing import Any

from text2grad.apps.prepare_data.common import conversation_reply, split_by_key
from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.prepare_data.sources import SchemaError, check_columns, load_split

logger = logging.getLogger("text2grad.apps.prepare_data")

SPLITS = ("train_prefs", "test_prefs", "train_sft", "test_sft", "train_gen", "test_gen")
COLUMNS = ("prompt", "prompt_id", "chosen", "rejected", "score_chosen", "score_rejected")


def is_tie(score_chosen: Any, score_rejected: Any) -> bool:
    """Both scores known and equal: the pair states no preference."""
    return score_chosen is not None and score_rejected is not None and score_chosen == score_rejected


def _pairs(rows: list[dict[str, Any]], skipped: dict[str, int], where: str) -> list[dict[str, Any]]:
    """Rows as text pairs with unique ids; rows whose conversations have no assistant reply are counted."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        chosen, rejected = conversation_reply(row["chosen"]), conversation_reply(row["rejected"])
        if not isinstance(row["prompt"], str) or chosen is None or rejected is None:
            reason = f"{where}: prompt not text or chosen/rejected without an assistant message"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        pid = str(row["prompt_id"])
        seen[pid] = seen.get(pid, 0) + 1
        key = pid if seen[pid] == 1 else f"{pid}#{seen[pid]}"
        scores = row.get("score_chosen"), row.get("score_rejected")
        out.append({"id": key, "prompt_id": pid, "prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
                    "score_chosen": scores[0], "score_rejected": scores[1], "tie": is_tie(*scores)})
    return out


def _check_types(data: Any) -> None:
    first = data.rows[0] if data.rows else None
    if first is not None and not isinstance(first["chosen"], list):
        raise SchemaError(
            f"ultrafeedback split {data.split!r} ({data.origin}): column 'chosen' holds {type(first['chosen']).__name__}, "
            "expected a list of {role, content} messages (the binarized layout)"
        )


def prepare(cfg: PrepareDataConfig) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    eval_split = cfg.eval_split or "test_prefs"
    if eval_split not in SPLITS:
        raise SchemaError(f"ultrafeedback: eval_split {eval_split!r} is not a split of ultrafeedback_binarized; "
                          f"choose one of {list(SPLITS)}")
    if eval_split == "train_prefs":
        raise SchemaError("ultrafeedback: eval_split 'train_prefs' is the training split itself (its pairs become the "
                          "SFT, reward-model and RL parts), so eval.jsonl would score what was trained on; use "
                          "test_prefs, the held-out preference split (the default)")
    fractions = cfg.resolved_fractions()
    unknown = set(fractions) - {"sft", "rm", "rl"}
    if unknown:
        raise SchemaError(f"ultrafeedback: fractions may name sft, rm and rl, not {sorted(unknown)}")
    train = load_split("ultrafeedback", cfg.dataset_path, "train_prefs", "train_prefs", cfg.max_samples)
    check_columns(train, ("prompt", "prompt_id", "chosen", "rejected"))
    _check_types(train)
    test = load_split("ultrafeedback", cfg.dataset_path, eval_split, "train_prefs", cfg.max_samples)
    check_columns(test, ("prompt", "prompt_id", "chosen", "rejected"))
    _check_types(test)

    skipped: dict[str, int] = {}
    pairs = _pairs(train.rows, skipped, "train_prefs")
    eval_rows = _pairs(test.rows, skipped, eval_split)
    ties = {"train_prefs": sum(p["tie"] for p in pairs), eval_split: sum(p["tie"] for p in eval_rows),
            "dropped": cfg.drop_ties}
    if cfg.drop_ties:
        pairs = [p for p in pairs if not p["tie"]]
        eval_rows = [p for p in eval_rows if not p["tie"]]
    shared = {p["prompt_id"] for p in eval_rows} & {p["prompt_id"] for p in pairs}
    if shared:
        logger.warning("ultrafeedback: %d prompt(s) of eval split %r are also training prompts (e.g. %s); eval.jsonl "
                       "then partly scores what was trained on", len(shared), eval_split, sorted(shared)[0])
    part_of = split_by_key([p["prompt_id"] for p in pairs], fractions, cfg.seed)
    parts: dict[str, list[dict[str, Any]]] = {name: [] for name in ("sft", "rm", "rl")}
    for pair in pairs:
        parts[part_of[pair["prompt_id"]]].append(pair)

    sft = [{"id": p["id"], "prompt_id": p["prompt_id"], "prompt": p["prompt"], "completion": p["chosen"]}
           for p in parts["sft"]]
    annotation = []
    for p in parts["rm"]:
        for label in ("chosen", "rejected"):
            annotation.append({"id": f"{p['id']}:{label}", "prompt_id": p["prompt_id"], "prompt": p["prompt"],
                               "response": p[label], "label": label, "score": p[f"score_{label}"], "tie": p["tie"]})
    rl = [{"id": p["id"], "prompt_id": p["prompt_id"], "prompt": p["prompt"], "reference": p["chosen"]}
          for p in parts["rl"]]
    files = {"annotation_input.jsonl": annotation, "sft.jsonl": sft, "rl_prompts.jsonl": rl,
             "eval.jsonl": eval_rows, "preference_pairs.jsonl": parts["rm"]}
    prompts = {name: len({p["prompt_id"] for p in rows}) for name, rows in parts.items()}
    report = {
        "splits": {"train_prefs": {"rows": len(train.rows), "from": train.origin},
                   eval_split: {"rows": len(test.rows), "from": test.origin}},
        "eval_split": eval_split,
        "fractions": fractions,
        "seed": cfg.seed,
        "parts": {name: {"pairs": len(rows), "prompts": prompts[name]} for name, rows in parts.items()},
        "repeated_prompt_ids": sum(1 for p in pairs if "#" in p["id"]),
        "ties": ties,
        "eval_prompts_in_training": len(shared),
        "skipped": skipped,
    }
    return files, report
