"""The quickstart report: PNG figures and a self-contained HTML page a person reads (``report/index.html``).

``curves.png`` (every reward mode on every panel):

- the reward model's sequence score of the PPO rollouts, ``(#good - #poor) / (#good + #poor)`` quotes, which
  is comparable across modes (the raw PPO reward is a sum of token rewards in one mode and one number in the
  other, so it is not);
- the true fact score of the same rollouts (`text2grad.apps.quickstart.task.fact_scores`, the critic the reward
  model imitates), which shows whether the reward model's preferences transfer;
- the eval fact score (greedy, eval split) at every evaluation point, and ROUGE-L;
- the sequence KL to the start policy (the SFT policy, or the model given as sft_model).

``rm_confusion.png``: the reward model's token labels against the critic's on held-out annotations.

``index.html``: the results table; the reward-model evaluation as tables and the confusion figure; the mean
change of token log-probability by reward-model label, split by position in the span, with how to read it;
the curves; sample eval posts with the start policy's summary coloured by the reward model's token labels and
each token's log-probability change; the installed versions and the commands that produced the run.

Token log-probabilities are computed on the exact token ids the start policy generated (not a re-encoding of
its text), labelled the way PPO labels its rollouts (``occurrence="first"``: a repeated quote labels only its
first occurrence).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib
import numpy as np
import yaml

from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart.results import _NAMES, generate_responses, results_table
from text2grad.apps.quickstart.results import describe_feedback_errors, feedback_error_rates
from text2grad.apps.quickstart.task import FactCritic, critique_summary, fact_scores
from text2grad.core.data import iter_jsonl
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_causal_lm, load_tokenizer
from text2grad.core.ppo_math import logprobs_from_logits
from text2grad.core.rewards import span_sequence_score
from text2grad.core.spans import decode_with_offsets, feedback_token_labels

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
import torch  # noqa: E402

__all__ = ["rollout_curves", "token_logprobs", "logprob_shift", "logprob_shift_by_position", "plot_curves",
           "plot_confusion", "write_report", "describe_results", "describe_shift"]

# How PPO labels its rollouts in the quickstart (pipeline.stage_ppo passes --occurrence first).
LABEL_OCCURRENCE = "first"


def rollout_curves(samples_path: Path, critic: FactCritic | None = None) -> list[dict[str, float]]:
    """Per PPO iteration: mean reward-model span score and mean true fact score of the logged rollouts.

    Reads ``samples.jsonl`` of ``policy_optimization.train`` (each line: iteration, feedback_prompt,
    response, feedback with good/poor spans and error). ``critic``: a `FactCritic` knowing the RL prompts, for
    the true fact score (NaN without it).
    """
    if not samples_path.is_file():
        return []
    by_iter: dict[int, list[tuple[float, float | None]]] = {}
    for row in iter_jsonl(samples_path):
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
    return list(iter_jsonl(path)) if path.is_file() else []


_COLORS = {"nl_gradient": "#1b7837", "scalar": "#b2182b", "dense": "#2166ac", "score_spread": "#e08214", "mixed": "#762a83"}
_LABELS = {"nl_gradient": "Text2Grad (NL-gradient)", "scalar": "scalar PPO", "dense": "dense", "score_spread": "score spread",
           "mixed": "mixed"}


def plot_curves(
    png: Path,
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    rollouts: Mapping[str, Sequence[Mapping[str, float]]],
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
) -> Path:
    """Four panels, one line per reward mode; see the module docstring."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    ax_rm, ax_true, ax_eval, ax_kl = axes.flat
    for mode in curves:
        c, lab = _COLORS.get(mode), _LABELS.get(mode, mode)
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
    ax_kl.set_title("KL(policy || start policy) per response (nats)")
    for ax in axes.flat:
        ax.set_xlabel("PPO iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png


def plot_confusion(png: Path, counts: Sequence[Sequence[int]], order: Sequence[str]) -> Path:
    """The (3, 3) token confusion matrix (rows: critic's label, columns: reward model's), counts and row shares."""
    m = np.asarray(counts, dtype=float)
    shares = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(5.2, 4.4), dpi=110)
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(j, i, f"{int(m[i, j])}\n{shares[i, j]:.0%}", ha="center", va="center", fontsize=10,
                    color="white" if shares[i, j] > 0.6 else "black")
    ax.set_xticks(range(len(order)), order)
    ax.set_yticks(range(len(order)), order)
    ax.set_xlabel("reward model's label")
    ax.set_ylabel("critic's label (reference)")
    ax.set_title("Token labels on held-out annotations\n(count and share of the row)")
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
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
    lp = logprobs_from_logits(logits, ids[:, 1:])[0, len(prompt_ids) - 1 :]
    return [float(x) for x in lp]


def _label_key(label: int) -> str:
    return "good" if label > 0 else "poor" if label < 0 else "neutral"


def logprob_shift(items: Sequence[Mapping[str, Any]], policy: str, labels: str = "labels") -> dict[str, float]:
    """Mean change of token log-prob (``policy`` minus the start policy) over all tokens with each label: the reward model's
    (``labels="labels"``) or the critic's true ones (``labels="true_labels"``)."""
    sums = {"good": [0.0, 0], "poor": [0.0, 0], "neutral": [0.0, 0]}
    for it in items:
        for lab, before, after in zip(it[labels], it["logp"]["sft"], it["logp"][policy]):
            sums[_label_key(lab)][0] += after - before
            sums[_label_key(lab)][1] += 1
    return {k: (s / n if n else float("nan")) for k, (s, n) in sums.items()}


def logprob_shift_by_position(items: Sequence[Mapping[str, Any]], policy: str,
                              labels: str = "labels") -> dict[str, dict[str, float]]:
    """The same change split by where a labelled token sits: ``first`` token of a labelled run (where the
    policy chooses to start the quote) or ``inside`` it (continuations once the run has started); each entry
    ``{"mean": ..., "n": ...}``. Unlabelled tokens are ``neutral``."""
    sums: dict[str, list[float]] = {}
    for it in items:
        prev = 0
        for lab, before, after in zip(it[labels], it["logp"]["sft"], it["logp"][policy]):
            key = "neutral" if lab == 0 else f"{_label_key(lab)}_{'inside' if lab == prev else 'first'}"
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += after - before
            acc[1] += 1
            prev = lab
    order = ("good_first", "good_inside", "poor_first", "poor_inside", "neutral")
    return {k: {"mean": sums[k][0] / sums[k][1], "n": int(sums[k][1])} for k in order if k in sums}


def _token_items(eval_records, sft_generations, policies, reward_model, grounded_spans: bool = True):
    """For each eval post: the start policy's summary: its exact token ids, reward-model labels and log-probs under every policy."""
    rm = GenerativeRewardModel.from_pretrained(str(reward_model), max_new_tokens=128, batch_size=64,
                                               grounded_spans=grounded_spans)
    records = list(eval_records)
    feedbacks = rm.feedback([r["prompt"] for r in records], [g.text for g in sft_generations])
    tokenizer = load_tokenizer(str(policies["sft"]))
    items = []
    for rec, gen, fb in zip(records, sft_generations, feedbacks):
        ids = list(gen.response_ids)
        text, offsets = decode_with_offsets(tokenizer, ids)
        labels = (feedback_token_labels(fb, text, offsets, occurrence=LABEL_OCCURRENCE).labels if fb.ok
                  else [0] * len(ids))
        truth = critique_summary(rec["facts"], gen.text)
        items.append({
            "record": rec, "response": gen.text, "ids": ids, "prompt_ids": list(gen.prompt_ids), "offsets": offsets,
            "text": text, "labels": labels, "feedback": fb, "truth": truth, "logp": {},
            "true_labels": feedback_token_labels(truth, text, offsets, occurrence=LABEL_OCCURRENCE).labels,
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
        shown = html.escape(tok).replace(" ", "&nbsp;") or "&#9251;"  # an empty interval: EOS
        cells.append(f'<div class="tok"><div class="t" style="background:{bg}">{shown}</div>{"".join(rows)}</div>')
    return "".join(cells)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
td:first-child,th:first-child{text-align:left} th{background:#f4f4f4}
nav a{margin-right:1em}
img{max-width:100%;border:1px solid #eee}
.note{color:#444;font-size:.95em;max-width:60em}
.post{background:#fafafa;border-left:3px solid #999;padding:.5em 1em;font-size:.92em}
.tokens{display:flex;flex-wrap:wrap;gap:2px;margin:.6em 0}
.tok{display:flex;flex-direction:column;align-items:stretch;min-width:2.2em}
.t{font-family:ui-monospace,Menlo,monospace;padding:2px 3px;border-radius:3px;text-align:center;white-space:pre}
.bar{height:14px;position:relative;background:#fff;border:1px solid #eee;margin-top:1px}
.bar span{display:block;height:100%}
.bar small{position:absolute;top:-1px;left:2px;font-size:10px;color:#000}
.legend span{padding:2px 6px;margin-right:8px;border-radius:3px}
.crit{font-size:.92em} .crit b{display:inline-block;min-width:12em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
"""

_SECTIONS = (("results", "Results"), ("reward-model", "Reward model"), ("logprob", "Token log-probabilities"),
             ("curves", "Curves"), ("samples", "Samples"), ("provenance", "Versions and commands"))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{b}</table>"


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "n/a" if x != x else f"{x:.3f}"
    return str(x)


def _signed(x: float) -> str:
    return "n/a" if x != x else f"{x:+.3f}"


def _rm_section(rm_report: Mapping[str, Any], out_dir: Path) -> str:
    """The reward model's held-out evaluation as tables and the confusion-matrix figure."""
    if not rm_report:
        return "<p>No reward-model evaluation (a given reward model was used).</p>"
    spans = rm_report.get("spans") or {}
    overview = [
        ("held-out annotations", rm_report.get("n_examples")),
        ("valid JSON", rm_report.get("json_validity_rate")),
        ("quotes not found in the response", rm_report.get("unmatched_span_rate")),
        ("token label accuracy", rm_report.get("token_label_accuracy")),
        ("reference spans matched exactly by a quote", f"{spans['exact']} of {spans['n_reference']}"
         if "exact" in spans and "n_reference" in spans else None),
        ("reward-model quotes overlapping a reference span", f"{spans['predicted_overlapping']} of {spans['n_predicted']}"
         if "predicted_overlapping" in spans and "n_predicted" in spans else None),
    ]
    parts = ["<p class='note'>The reward model wrote a critique and quoted good and poor spans for responses it "
             "never saw in training; its quotes are compared token by token with the annotation critic's "
             "(the reference).</p>", _table(["measure", "value"], [(k, v) for k, v in overview if v is not None])]
    token = rm_report.get("token") or {}
    if token:
        parts.append(_table(["token class", "precision", "recall", "F1", "reference tokens", "predicted tokens"],
                            [(c, v.get("precision"), v.get("recall"), v.get("f1"), v.get("support"), v.get("predicted"))
                             for c, v in token.items()]))
    conf = rm_report.get("token_confusion") or {}
    if conf.get("counts"):
        png = plot_confusion(out_dir / "rm_confusion.png", conf["counts"], conf.get("order") or ["positive", "negative", "neutral"])
        parts.append(f"<p><img src='{png.name}' alt='reward-model token confusion matrix' width='520'></p>")
    return "".join(parts)


def describe_shift(policy: str, shift: Mapping[str, float], by_position: Mapping[str, Mapping[str, float]],
                   whose: str) -> str:
    """One or two sentences read from a log-prob shift table: which way poor and good tokens moved, and whether
    the poor ones lost probability relative to the good ones (``whose``: whose labels, e.g. "the reward model's")."""
    poor, good = shift.get("poor", float("nan")), shift.get("good", float("nan"))
    if poor != poor or good != good:
        return f"{policy}: {whose} labels mark no {'poor' if poor != poor else 'good'} tokens here, so there is nothing to compare."
    if max(abs(poor), abs(good)) < 5e-4:  # e.g. early stopping kept the start policy itself
        return f"Under {policy}, neither poor nor good tokens ({whose} labels) moved (both within 0.0005 nats)."
    gap = poor - good
    text = (f"Under {policy}, tokens {whose} labels call poor moved by {poor:+.3f} nats and good ones by {good:+.3f}: "
            + (f"the poor tokens lost {-gap:.3f} nats relative to the good ones." if gap < 0 else
               f"the poor tokens did not lose probability relative to the good ones (they gained {gap:.3f} nats more)."))
    first = by_position.get("poor_first")
    if first:
        text += (f" The first tokens of poor quotes, where the policy chooses to write the flaw, moved by {first['mean']:+.3f} "
                 f"(n={first['n']}): they {'fell' if first['mean'] < 0 else 'rose'}.")
    return text


def _shift_tables(shift, by_position) -> list[str]:
    keys = ("good_first", "good_inside", "poor_first", "poor_inside", "neutral")
    return [_table(["policy", "good tokens", "poor tokens", "unlabelled tokens"],
                   [(p, *(_signed(s[k]) for k in ("good", "poor", "neutral"))) for p, s in shift.items()]),
            "<p class='note'>Split by position in the labelled run:</p>",
            _table(["policy", *(k.replace("_", " ") for k in keys)],
                   [(p, *(f"{_signed(b[k]['mean'])} (n={b[k]['n']})" if k in b else "no tokens" for k in keys))
                    for p, b in by_position.items()])]


def _logprob_section(shift: Mapping[str, Mapping[str, float]], by_position: Mapping[str, Mapping[str, Mapping[str, float]]],
                     n_tokens: Mapping[str, int], true_shift: Mapping[str, Mapping[str, float]] | None = None,
                     true_by_position: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None) -> str:
    parts = ["<p class='note'>Over the start policy's greedy summaries of every eval post, the same token ids "
             "(exactly as the start policy generated them) are scored by the start policy and by each trained policy. "
             "Text2Grad rewards each poor token with -1 and each good one with +1, so it is expected to lower poor "
             "tokens relative to good ones. Every token here is the start policy's greedy choice, so it starts near "
             "log p = 0 and can mostly only fall: compare the columns with each other, not with zero.</p>",
             "<p><b>By the reward model's labels (as PPO labels its rollouts)</b></p>",
             f"<p class='note'>Tokens: {n_tokens.get('good', 0)} good, {n_tokens.get('poor', 0)} poor, "
             f"{n_tokens.get('neutral', 0)} unlabelled.</p>", *_shift_tables(shift, by_position),
             "<p>" + " ".join(html.escape(describe_shift(_policy_name(p), shift[p], by_position.get(p, {}),
                                                          "the reward model's")) for p in shift) + "</p>"]
    if true_shift:
        parts += ["<p><b>By the critic's true labels (the task's fact check)</b></p>",
                  *_shift_tables(true_shift, true_by_position or {}),
                  "<p>" + " ".join(html.escape(describe_shift(_policy_name(p), true_shift[p], (true_by_position or {}).get(p, {}),
                                                               "the critic's true")) for p in true_shift) + "</p>"]
    return "".join(parts)


def describe_results(results: Mapping[str, Mapping[str, float]], curves: Mapping[str, Sequence[Mapping[str, float]]],
                     selected: Mapping[str, int] | None = None, kl_end: Mapping[str, float] | None = None) -> list[str]:
    """Sentences read from the results: each trained policy against the start policy and the other modes, the
    iteration early stopping kept against the end of training, and the KL to the start at the end."""
    start = results.get("sft", {}).get("fact_score")
    lines = []
    modes = [m for m in results if m != "sft"]
    for m in modes:
        score = results[m]["fact_score"]
        name = _policy_name(m)
        others = [o for o in modes if o != m]
        text = f"{name} scores {score:.3f} on the eval split"
        if start is not None:
            text += f", {score - start:+.3f} against the start policy ({start:.3f})"
        if others:
            text += "; " + ", ".join(f"{score - results[o]['fact_score']:+.3f} against {_policy_name(o)}" for o in others)
        curve = [p for p in curves.get(m, []) if "fact_score" in p]
        kept = (selected or {}).get(m)
        if curve and kept is not None and kept != curve[-1]["iteration"]:
            end = curve[-1]
            text += (f". Early stopping kept iteration {kept}; at the end of training (iteration {end['iteration']}) it "
                     f"scored {end['fact_score']:.3f} ({end['fact_score'] - score:+.3f})")
        if kl_end and m in kl_end:
            text += f"; KL to the start policy at the end: {kl_end[m]:.2f} nats"
        lines.append(text + ".")
    return lines


def _policy_name(mode: str) -> str:
    return _NAMES.get(mode, mode)


def _provenance_section(versions: Mapping[str, Any] | None, commands: Sequence[str]) -> str:
    parts = []
    if versions:
        rows = [("python", versions.get("python")), ("platform", versions.get("platform"))]
        rows += [(k, v or "not installed") for k, v in (versions.get("packages") or {}).items()]
        rows += [("environment hash (every installed package)", versions.get("environment_sha256")),
                 ("lock file", f"{versions.get('lock_file')} ({versions.get('lock_sha256')})" if versions.get("lock_file") else "none"),
                 ("installed versions that differ from the lock",
                  ", ".join(f"{k} {a} (locked {b})" for k, (a, b) in versions.get("differs_from_lock", {}).items()) or "none")]
        parts.append(_table(["", "version"], rows))
        parts.append(f"<p>Quickstart command:</p><pre>{html.escape(versions.get('command') or '')}</pre>")
    if commands:
        parts.append("<p>Phase commands, in order (also in <code>../commands.sh</code>):</p><pre>"
                     + html.escape("\n".join(c for c in commands if c.strip())) + "</pre>")
    return "".join(parts)


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
    grounded_spans: bool = True,
    versions: Mapping[str, Any] | None = None,
    commands: Sequence[str] = (),
    use_chat_template: bool = False,
    start_name: str = "SFT policy",
    max_feedback_error_rate: float | None = None,
    selected: Mapping[str, int] | None = None,
    mode_args: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Write curves.png, rm_confusion.png and index.html under ``out_dir``; returns their paths, the log-prob shift
    summaries (by the reward model's and by the critic's true labels) and the sentences that read the results.

    ``selected``: the iteration each mode's reported policy comes from (early stopping), if not the last."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    critic = FactCritic(records=list(eval_records) + _rl_records(metrics_files))
    rollouts = {m: rollout_curves(Path(p).with_name("samples.jsonl"), critic) for m, p in metrics_files.items()}
    metrics = {m: _metrics(Path(p)) for m, p in metrics_files.items()}
    png = plot_curves(out_dir / "curves.png", curves, rollouts, metrics)
    kl_end = {m: rows[-1]["objective/kl"] for m, rows in metrics.items() if rows and "objective/kl" in rows[-1]}

    sft_generations = generate_responses(Path(policies["sft"]), [r["prompt"] for r in eval_records], response_length,
                                         False, seed, use_chat_template=use_chat_template)
    items = _token_items(eval_records, sft_generations, policies, reward_model, grounded_spans)
    trained = [p for p in policies if p != "sft"]
    shift = {p: logprob_shift(items, p) for p in trained}
    by_position = {p: logprob_shift_by_position(items, p) for p in trained}
    true_shift = {p: logprob_shift(items, p, "true_labels") for p in trained}
    true_by_position = {p: logprob_shift_by_position(items, p, "true_labels") for p in trained}
    n_tokens = {k: sum(_label_key(l) == k for it in items for l in it["labels"]) for k in ("good", "poor", "neutral")}
    main = "nl_gradient" if "nl_gradient" in shift else (trained[0] if trained else None)

    # show flawed start-policy summaries first: that is where token credit matters
    order = sorted(range(len(items)), key=lambda i: (not items[i]["truth"].poor_spans, i))[:n_samples]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Text2Grad quickstart report</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>Text2Grad quickstart: what the reward model said, and what the policy learned</h1>",
             "<nav>" + "".join(f"<a href='#{a}'>{t}</a>" for a, t in _SECTIONS) + "</nav>",
             "<h2 id='results'>Results (eval split, greedy decoding)</h2>", _md_table_html(results_table(results, start_name)),
             "<p>" + " ".join(html.escape(x) for x in describe_results(results, curves, selected, kl_end)) + "</p>",
             "<p class='note'>Settings: every mode shares the preset's PPO flags (commands below)"
             + ("; on top of them " + "; ".join(f"{html.escape(_policy_name(m))} runs with {html.escape(' '.join(a))}"
                                                for m, a in mode_args.items() if a) if mode_args and any(mode_args.values())
                else ", with no per-mode changes") + ".</p>",
             "<p class='note'>fact_score = (correct - false facts) / 5 per summary; fact_recall = correct facts / 5; "
             "n_false = false facts per summary; perfect = share of summaries with every fact right and none false.</p>",
             "<h2 id='reward-model'>Reward model on held-out annotations</h2>", _rm_section(rm_report, out_dir),
             "<p class='note'>During PPO: " + html.escape(describe_feedback_errors(
                 feedback_error_rates(metrics_files), max_feedback_error_rate)) + ".</p>",
             "<h2 id='logprob'>Mean change of token log-probability after training, by reward-model label</h2>",
             _logprob_section(shift, by_position, n_tokens, true_shift, true_by_position),
             "<h2 id='curves'>Curves</h2>",
             f"<p><img src='{png.name}' alt='training and evaluation curves'></p>",
             "<h2 id='samples'>Samples</h2><p class='legend'>Token colour = reward-model label: "
             "<span style='background:#a6dba0'>good (+1)</span><span style='background:#f4a582'>poor (-1)</span>"
             "<span style='background:#f0f0f0'>no label (0)</span>. Bars under each token: change of its "
             "log-probability from the start policy to "
             + ", ".join(f"<b>{html.escape(p)}</b> (row {i + 1})" for i, p in enumerate(trained))
             + " (<span style='color:#2166ac'>blue up</span>, <span style='color:#d6604d'>red down</span>; hover for values).</p>"]
    for i in order:
        it = items[i]
        rec, fb, truth = it["record"], it["feedback"], it["truth"]
        parts.append(f"<h3>{html.escape(rec['id'])}</h3><div class='post'>{html.escape(rec['prompt'])}</div>")
        parts.append("<div class='crit'>"
                     f"<div><b>start policy's summary</b>{html.escape(it['response'])}</div>"
                     f"<div><b>reference</b>{html.escape(rec['reference'])}</div>"
                     f"<div><b>reward model critique</b>{html.escape(fb.critique if fb.ok else 'failed: ' + str(fb.error))}"
                     f" good={html.escape(json.dumps(list(fb.good_spans)))} poor={html.escape(json.dumps(list(fb.poor_spans)))}</div>"
                     f"<div><b>true critique (FactCritic)</b>{html.escape(truth.critique)}</div></div>")
        parts.append(f"<div class='tokens'>{_token_html(it, list(policies))}</div>")
    parts.append("<h2 id='provenance'>Versions and commands that produced this report</h2>")
    parts.append(_provenance_section(versions, commands))
    parts.append("</body></html>")
    page = out_dir / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return {"png": png, "html": page, "logprob_shift": shift.get(main, {}) if main else {},
            "logprob_shift_all": shift, "logprob_shift_by_position": by_position.get(main, {}) if main else {},
            "logprob_shift_true": true_shift.get(main, {}) if main else {},
            "logprob_shift_true_by_position": true_by_position.get(main, {}) if main else {},
            "interpretation": describe_results(results, curves, selected, kl_end)
            + [describe_shift(_policy_name(p), shift[p], by_position[p], "the reward model's") for p in trained]
            + [describe_shift(_policy_name(p), true_shift[p], true_by_position[p], "the critic's true") for p in trained],
            "rollouts": rollouts}


def _rl_records(metrics_files: Mapping[str, Path]) -> list[dict[str, Any]]:
    """The RL prompts (with facts) the PPO runs used, read from the data dir recorded in their config."""
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
    return _table(rows[0], rows[1:])
