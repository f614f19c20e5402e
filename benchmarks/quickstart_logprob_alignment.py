"""Does the report's per-token log-prob change depend on how tokens are aligned and labelled? Measured on a
finished quickstart run.

    python benchmarks/quickstart_logprob_alignment.py runs/quickstart [--policy nl_gradient]

For the SFT policy's greedy summaries of the eval posts, the mean log-prob change (trained policy minus SFT) by
label is computed four ways:

- ``reencoded / all``: the summary's text re-encoded and every occurrence of a quote labelled (the report's
  earlier method);
- ``exact ids / all``: the token ids the SFT policy generated, every occurrence labelled;
- ``exact ids / first``: the generated ids, a quote labelling its first occurrence only (how PPO labels rollouts,
  ``--occurrence first``; the report's method now);
- ``exact ids / first / critic``: the same with the annotation critic's labels instead of the reward model's
  (the truth the reward model imitates).

Also counted: summaries whose re-encoding differs from the generated ids, and tokens whose label differs between
``all`` and ``first``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart.report import logprob_shift, logprob_shift_by_position, token_logprobs
from text2grad.apps.quickstart.results import generate_responses
from text2grad.apps.quickstart.task import critique_summary
from text2grad.core.modeling import load_causal_lm, load_tokenizer
from text2grad.core.spans import decode_with_offsets, feedback_token_labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="output_dir of a finished quickstart run")
    parser.add_argument("--policy", default="nl_gradient", help="trained policy to compare with the SFT policy")
    args = parser.parse_args(argv)
    out = Path(args.run_dir)
    summary = json.loads((out / "results.json").read_text())
    cfg = summary["config"]
    sel = summary.get("selection", {}).get(args.policy, {})
    rms = sel.get("reward_models") or []
    records = [json.loads(l) for l in (out / "data" / "eval.jsonl").read_text().splitlines()]
    commands = (out / "commands.sh").read_text()
    sft = commands.split("policy_optimization.train --model_name_or_path ", 1)[1].split()[0]
    rm_path = rms[0] if rms else summary["config"].get("reward_model") or _rm_from_commands(commands)
    trained = out / f"ppo-{args.policy}" / "policy"

    gens = generate_responses(Path(sft), [r["prompt"] for r in records], cfg["response_length"], False, cfg["seed"])
    tok = load_tokenizer(sft)
    rm = GenerativeRewardModel.from_pretrained(rm_path, max_new_tokens=128, batch_size=64,
                                               grounded_spans=cfg.get("grounded_spans", True))
    feedbacks = rm.feedback([r["prompt"] for r in records], [g.text for g in gens])
    truths = [critique_summary(r["facts"], g.text) for r, g in zip(records, gens)]
    models = {"sft": load_causal_lm(sft).eval(), args.policy: load_causal_lm(str(trained)).eval()}

    def items(reencode: bool, occurrence: str, use_truth: bool) -> list[dict]:
        rows = []
        for g, fb, truth in zip(gens, feedbacks, truths):
            ids = tok(g.text, add_special_tokens=False)["input_ids"] if reencode else list(g.response_ids)
            prompt_ids = list(g.prompt_ids)
            text, offsets = decode_with_offsets(tok, ids)
            source = truth if use_truth else fb
            labels = feedback_token_labels(source, text, offsets, occurrence=occurrence).labels if source.ok else [0] * len(ids)
            rows.append({"labels": labels, "logp": {n: token_logprobs(m, prompt_ids, ids) if ids else [] for n, m in models.items()}})
        return rows

    differs = sum(tok(g.text, add_special_tokens=False)["input_ids"] != [i for i in g.response_ids if i != tok.eos_token_id]
                  for g in gens)
    ways = {"re-encoded text, every occurrence (earlier report)": (True, "all", False),
            "generated ids, every occurrence": (False, "all", False),
            "generated ids, first occurrence (as PPO; report now)": (False, "first", False),
            "generated ids, first occurrence, critic's labels": (False, "first", True)}
    lines = [f"Run {out} ({args.policy} vs SFT, {len(gens)} eval posts); {differs} of {len(gens)} greedy summaries "
             f"re-encode to other ids than generated (EOS aside).", "",
             "| alignment / labels | good | poor | unlabelled | poor, first token | poor, inside | tokens good/poor/unlabelled |",
             "|---|---:|---:|---:|---:|---:|---|"]
    per_way = {}
    for name, (reencode, occ, truth) in ways.items():
        rows = items(reencode, occ, truth)
        per_way[name] = rows
        s = logprob_shift(rows, args.policy)
        p = logprob_shift_by_position(rows, args.policy)
        n = {k: sum((l > 0, l < 0, l == 0)[i] for r in rows for l in r["labels"]) for i, k in enumerate(("good", "poor", "neutral"))}
        f = lambda k: f"{p[k]['mean']:+.3f}" if k in p else "n/a"  # noqa: E731
        lines.append(f"| {name} | {s['good']:+.3f} | {s['poor']:+.3f} | {s['neutral']:+.3f} | {f('poor_first')} | "
                     f"{f('poor_inside')} | {n['good']}/{n['poor']}/{n['neutral']} |")
    a, b = per_way["generated ids, every occurrence"], per_way["generated ids, first occurrence (as PPO; report now)"]
    changed = sum(x != y for ra, rb in zip(a, b) for x, y in zip(ra["labels"], rb["labels"]))
    lines.append(f"\nTokens whose label differs between every-occurrence and first-occurrence labelling: {changed}.")
    print("\n".join(lines))
    return 0


def _rm_from_commands(commands: str) -> str:
    return json.loads(commands.split("--critic_kwargs '", 1)[1].split("'", 1)[0])["path"]


if __name__ == "__main__":
    sys.exit(main())
