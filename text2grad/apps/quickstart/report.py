"""The quickstart report: a PNG of training and eval curves, and a self-contained HTML page of token credit.

``curves.png`` (both reward modes on every panel):

- the reward model's sequence score of the PPO rollouts, ``(#good - #poor) / (#good + #poor)`` quotes, which
  is comparable across modes (the raw PPO reward is a sum of token rewards in one mode and one number in the
  other, so it is not);
- the true fact score of the same rollouts (`text2grad.apps.quickstart.task.fact_scores`, the critic the reward
  model imitates), which shows whether the reward model's preferences transfer;
- the eval fact score (greedy, eval split) at every evaluation point, and ROUGE-L;
- the sequence KL to the SFT policy.

``index.html`` shows, for sample eval posts, the SFT policy's summary, the reward model's critique, the
summary's tokens coloured by the reward model's token labels, and under each token how its log-probability
changed from the SFT policy to each trained policy (the paper's interpretability claim made visible).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["rollout_curves", "token_logprobs", "logprob_shift", "plot_curves", "write_report"]


def rollout_curves(samples_path: Path, critic=None) -> list[dict[str, float]]:
    """Per PPO iteration: mean reward-model span score and mean true fact score of the logged rollouts.

    Reads ``samples.jsonl`` of ``policy_optimization.train`` (each line: iteration, feedback_prompt,
    response, feedback with good/poor spans and error). ``critic``: a `FactCritic` knowing the RL prompts, for
    the true fact score (NaN without it).
    """
    from text2grad.core.rewards import span_sequence_score
    from text2grad.core.data import iter_jsonl
    from text2grad.core.feedback import Feedback
    from text2grad.apps.quickstart.task import fact_scores

    if not samples_path.is_file():
        return []
    rows = list(iter_jsonl(samples_path))
    by_iter: dict[int, list[tuple[float, float | None]]] = {}
    for row in rows:
        fb_dict = row.get("feedback") or {}
        fb = Feedback.from_dict(fb_dict)
        if fb_dict.get("error"):
            fb = Feedback.failed(str(fb_dict["error"]))
        facts = critic.facts_for(row.get("feedback_prompt") or row["prompt"]) if critic else None
        true = fact_scores(facts, row["response"])["fact_score"] if facts is not None else None
        by_iter.setdefault(int(row["iteration"]), []).append((span_sequence_score(fb), true))
    out = []
    for it in sorted(by_iter):
        vals = by_iter[it]
        trues = [t for _, t in vals if t is not None]
        out.append({
            "iteration": it,
            "rm_score": sum(v for v, _ in vals) / len(vals),
            "true_fact_score": sum(trues) / len(trues) if trues else float("nan"),
        })
    return out


def _metrics(path: Path) -> list[dict[str, Any]]:
    from text2grad.core.data import iter_jsonl

    return list(iter_jsonl(path)) if path.is_file() else []


def plot_curves(
    png: Path,
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    rollouts: Mapping[str, Sequence[Mapping[str, float]]],
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
) -> Path:
    """Four panels, one line per reward mode; see the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"nl_gradient": "#1b7837", "scalar": "#b2182b", "dense": "#2166ac", "mixed": "#762a83"}
    labels = {"nl_gradient": "Text2Grad (NL-gradient)", "scalar": "scalar PPO", "dense": "dense", "mixed": "mixed"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    ax_rm, ax_true, ax_eval, ax_kl = axes.flat
    for mode in curves:
        c, lab = colors.get(mode), labels.get(mode, mode)
        r = rollouts.get(mode) or []
        if r:
            xs = [p["iteration"] for p in r]
            ax_rm.plot(xs, _smooth([p["rm_score"] for p in r]), color=c, label=lab)
            ax_true.plot(xs, _smooth([p["true_fact_score"] for p in r]), color=c, label=lab)
        e = curves[mode]
        ax_eval.plot([p["iteration"] for p in e], [p["fact_score"] for p in e], "o-", color=c, label=f"{lab}: fact score")
        if all("rougeL" in p for p in e):
            ax_eval.plot([p["iteration"] for p in e], [p["rougeL"] for p in e], "s--", color=c, alpha=0.6,
                         label=f"{lab}: ROUGE-L")
        m = metrics.get(mode) or []
        if m:
            ax_kl.plot([p["iteration"] for p in m], [p.get("objective/kl", float("nan")) for p in m], color=c, label=lab)
    ax_rm.set_title("Reward-model score of PPO rollouts\n(#good - #poor quotes) / #quotes, smoothed")
    ax_true.set_title("True fact score of the same rollouts\n(programmatic critic), smoothed")
    ax_eval.set_title("Eval split, greedy decoding")
    ax_kl.set_title("KL(policy || SFT) per response (nats)")
    for ax in axes.flat:
        ax.set_xlabel("PPO iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png


def _smooth(values: Sequence[float], window: int = 3) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if v == v]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


def token_logprobs(model, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
    """log p(response_t | prompt, response_<t) under ``model`` for each response token, shape (T,)."""
    import torch

    from text2grad.core.ppo_math import logprobs_from_logits

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
    lp = logprobs_from_logits(logits, ids[:, 1:])[0, len(prompt_ids) - 1 :]
    return [float(x) for x in lp]


def logprob_shift(items: Sequence[Mapping[str, Any]], policy: str) -> dict[str, float]:
    """Mean change of token log-prob (``policy`` minus SFT) over all tokens with each reward-model label."""
    sums = {"good": [0.0, 0], "poor": [0.0, 0], "neutral": [0.0, 0]}
    for it in items:
        for lab, before, after in zip(it["labels"], it["logp"]["sft"], it["logp"][policy]):
            key = "good" if lab > 0 else "poor" if lab < 0 else "neutral"
            sums[key][0] += after - before
            sums[key][1] += 1
    return {k: (s / n if n else float("nan")) for k, (s, n) in sums.items()}


def _token_items(eval_records, sft_preds, policies, reward_model, n_all: int, grounded_spans: bool = True):
    """For each eval post: the SFT summary's tokens, reward-model labels and log-probs under every policy."""
    from reward_model.inference import GenerativeRewardModel
    from text2grad.core.modeling import load_causal_lm, load_tokenizer
    from text2grad.apps.quickstart.task import critique_summary
    from text2grad.core.spans import decode_with_offsets, feedback_token_labels

    tokenizer = load_tokenizer(str(policies["sft"]))
    rm = GenerativeRewardModel.from_pretrained(str(reward_model), max_new_tokens=128, batch_size=64,
                                               grounded_spans=grounded_spans)
    records = list(eval_records)[:n_all]
    responses = list(sft_preds)[:n_all]
    feedbacks = rm.feedback([r["prompt"] for r in records], responses)
    items = []
    for rec, resp, fb in zip(records, responses, feedbacks):
        prompt_ids = tokenizer(rec["prompt"])["input_ids"]
        resp_ids = tokenizer(resp, add_special_tokens=False)["input_ids"]
        text, offsets = decode_with_offsets(tokenizer, resp_ids)
        labels = feedback_token_labels(fb, text, offsets).labels if fb.ok else [0] * len(resp_ids)
        items.append({
            "record": rec, "response": resp, "ids": resp_ids, "prompt_ids": prompt_ids, "offsets": offsets,
            "text": text, "labels": labels, "feedback": fb, "truth": critique_summary(rec["facts"], resp), "logp": {},
        })
    for name, path in policies.items():
        model = load_causal_lm(str(path)).eval()
        for it in items:
            it["logp"][name] = token_logprobs(model, it["prompt_ids"], it["ids"]) if it["ids"] else []
        del model
    return items


def _token_html(it: Mapping[str, Any], policies: Sequence[str]) -> str:
    cells = []
    for i, (s, e) in enumerate(it["offsets"]):
        tok = it["text"][s:e]
        lab = it["labels"][i]
        bg = "#a6dba0" if lab > 0 else "#f4a582" if lab < 0 else "#f0f0f0"
        rows = []
        for name in policies:
            if name == "sft":
                continue
            d = it["logp"][name][i] - it["logp"]["sft"][i]
            color = "#2166ac" if d > 0 else "#d6604d"
            width = min(100, abs(d) * 25)
            rows.append(f'<div class="bar" title="{html.escape(name)}: log p {it["logp"]["sft"][i]:.2f} &rarr; '
                        f'{it["logp"][name][i]:.2f}"><span style="width:{width:.0f}%;background:{color}"></span>'
                        f'<small>{d:+.2f}</small></div>')
        cells.append(f'<div class="tok"><div class="t" style="background:{bg}">{html.escape(tok).replace(" ", "&nbsp;") or "&nbsp;"}'
                     f'</div>{"".join(rows)}</div>')
    return "".join(cells)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.4}
h1{font-size:1.5em} h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
.post{background:#fafafa;border-left:3px solid #999;padding:.5em 1em;font-size:.92em}
.tokens{display:flex;flex-wrap:wrap;gap:2px;margin:.6em 0}
.tok{display:flex;flex-direction:column;align-items:stretch;min-width:2.2em}
.t{font-family:ui-monospace,Menlo,monospace;padding:2px 3px;border-radius:3px;text-align:center;white-space:pre}
.bar{height:14px;position:relative;background:#fff;border:1px solid #eee;margin-top:1px}
.bar span{display:block;height:100%}
.bar small{position:absolute;top:-1px;left:2px;font-size:10px;color:#000}
.legend span{padding:2px 6px;margin-right:8px;border-radius:3px}
.crit{font-size:.92em} .crit b{display:inline-block;min-width:12em}
"""


def write_report(
    out_dir: Path,
    *,
    eval_records: Sequence[Mapping[str, Any]],
    policies: Mapping[str, Path],
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    metrics_files: Mapping[str, Path],
    reward_model: Path,
    results: Mapping[str, Mapping[str, float]],
    rm_report: Mapping[str, Any],
    n_samples: int,
    response_length: int,
    seed: int,
    sft_predictions: Sequence[str] | None = None,
    grounded_spans: bool = True,
) -> dict[str, Any]:
    """Write curves.png and index.html under ``out_dir``; returns their paths and the log-prob shift summary."""
    from text2grad.apps.quickstart.pipeline import _generate_texts, results_table

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from text2grad.apps.quickstart.task import FactCritic

    critic = FactCritic(records=list(eval_records) + _rl_records(metrics_files))
    rollouts = {m: rollout_curves(Path(p).with_name("samples.jsonl"), critic) for m, p in metrics_files.items()}
    metrics = {m: _metrics(Path(p)) for m, p in metrics_files.items()}
    png = plot_curves(out_dir / "curves.png", curves, rollouts, metrics)

    if sft_predictions is None:
        sft_predictions = _generate_texts(Path(policies["sft"]), [r["prompt"] for r in eval_records], response_length, False, seed)
    items = _token_items(eval_records, sft_predictions, policies, reward_model, len(eval_records), grounded_spans)
    trained = [p for p in policies if p != "sft"]
    shift = {p: logprob_shift(items, p) for p in trained}
    main_shift = shift.get("nl_gradient") or (shift[trained[0]] if trained else {})

    # show flawed SFT summaries first: that is where token credit matters
    order = sorted(range(len(items)), key=lambda i: (not items[i]["truth"].poor_spans, i))[:n_samples]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Text2Grad quickstart report</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>Text2Grad quickstart: what the reward model said, and what the policy learned</h1>",
             "<h2>Results (eval split, greedy decoding)</h2>", _md_table_html(results_table(results))]
    parts.append("<h2>Mean change of token log-probability after training, by reward-model label</h2>"
                 "<p>Over the SFT policy's greedy summaries of every eval post: the same token ids scored by the SFT "
                 "policy and by each trained policy. Text2Grad is expected to lower the tokens the reward model "
                 "marked poor and raise those it marked good.</p><table><tr><th>policy</th><th>good tokens</th>"
                 "<th>poor tokens</th><th>unlabelled tokens</th></tr>")
    for p, s in shift.items():
        parts.append(f"<tr><td>{html.escape(p)}</td>" + "".join(f"<td>{s[k]:+.3f}</td>" for k in ("good", "poor", "neutral")) + "</tr>")
    parts.append("</table>")
    if rm_report:
        parts.append("<h2>Reward model on held-out annotations</h2><pre>" + html.escape(json.dumps(rm_report, indent=1)[:3000]) + "</pre>")
    parts.append(f"<h2>Curves</h2><p>See <a href='curves.png'>curves.png</a> next to this file.</p>")
    parts.append("<h2>Samples</h2><p class='legend'>Token colour = reward-model label: "
                 "<span style='background:#a6dba0'>good (+1)</span><span style='background:#f4a582'>poor (-1)</span>"
                 "<span style='background:#f0f0f0'>no label (0)</span>. Bars under each token: change of its "
                 "log-probability from the SFT policy to "
                 + ", ".join(f"<b>{html.escape(p)}</b> (row {i + 1})" for i, p in enumerate(trained))
                 + " (<span style='color:#2166ac'>blue up</span>, <span style='color:#d6604d'>red down</span>; hover for values).</p>")
    for i in order:
        it = items[i]
        rec, fb, truth = it["record"], it["feedback"], it["truth"]
        parts.append(f"<h3>{html.escape(rec['id'])}</h3><div class='post'>{html.escape(rec['prompt'])}</div>")
        parts.append("<div class='crit'>"
                     f"<div><b>SFT summary</b>{html.escape(it['response'])}</div>"
                     f"<div><b>reference</b>{html.escape(rec['reference'])}</div>"
                     f"<div><b>reward model critique</b>{html.escape(fb.critique if fb.ok else 'failed: ' + str(fb.error))}"
                     f" good={html.escape(json.dumps(list(fb.good_spans)))} poor={html.escape(json.dumps(list(fb.poor_spans)))}</div>"
                     f"<div><b>true critique (FactCritic)</b>{html.escape(truth.critique)}</div></div>")
        parts.append(f"<div class='tokens'>{_token_html(it, list(policies))}</div>")
    parts.append("</body></html>")
    page = out_dir / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return {"png": png, "html": page, "logprob_shift": main_shift, "logprob_shift_all": shift, "rollouts": rollouts}


def _rl_records(metrics_files: Mapping[str, Path]) -> list[dict[str, Any]]:
    """The RL prompts (with facts) the PPO runs used, read from the data dir recorded in their config."""
    import yaml

    from text2grad.core.data import iter_jsonl

    for p in metrics_files.values():
        cfg_path = Path(p).with_name("ppo_config.yaml")
        if cfg_path.is_file():
            ds = (yaml.safe_load(cfg_path.read_text()) or {}).get("dataset_path")
            if ds and Path(ds).is_file():
                return [r for r in iter_jsonl(ds) if "facts" in r]
    return []


def _md_table_html(md: str) -> str:
    lines = [l for l in md.splitlines() if l.strip() and not set(l.replace("|", "").strip()) <= set("-:")]
    rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in lines]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"
