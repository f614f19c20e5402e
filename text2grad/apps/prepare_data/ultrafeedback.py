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
"""

from __future__ import annotations

from typing import Any

from text2grad.apps.prepare_data.common import conversation_reply, split_by_key
from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.prepare_data.sources import SchemaError, check_columns, load_split

SPLITS = ("train_prefs", "test_prefs", "train_sft", "test_sft", "train_gen", "test_gen")
COLUMNS = ("prompt", "prompt_id", "chosen", "rejected", "score_chosen", "score_rejected")


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
        out.append({"id": key, "prompt_id": pid, "prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
                    "score_chosen": row.get("score_chosen"), "score_rejected": row.get("score_rejected")})
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
                               "response": p[label], "label": label, "score": p[f"score_{label}"]})
    rl = [{"id": p["id"], "prompt_id": p["prompt_id"], "prompt": p["prompt"], "reference": p["chosen"]}
          for p in parts["rl"]]
    eval_rows = _pairs(test.rows, skipped, eval_split)
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
        "skipped": skipped,
    }
    return files, report
