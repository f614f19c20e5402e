"""Two critics (e.g. the CoT and the no-CoT reward model) compared with the paper's protocol.

    python -m text2grad.apps.evaluation.compare_feedback --dataset_path runs/slf5k/annotations_validation.jsonl \\
        --candidate_critic_kwargs '{"path": "runs/slf5k/reward_model"}' --baseline_critic_kwargs '{"path": "runs/slf5k/reward_model_nocot"}' \\
        --tokenizer runs/slf5k/reward_model --judge_model gpt-4o --output_dir runs/slf5k/cot_vs_nocot

Both critics write feedback on every held-out (prompt, response); then

- an LLM judge (any OpenAI-compatible server, `text2grad.apps.evaluation.judge`) compares the two feedbacks per
  item, shown in a seeded random order, and the candidate's win / tie / loss rates are reported (the paper's
  CoT vs no-CoT comparison, Appendix M: 72.17 : 7.01 : 20.82);
- each critic's feedback is scored against the reference annotations with the token metrics of
  `reward_model.metrics` (per-class token precision/recall/F1, span matches, JSON validity).

A critic is any name or ``package.module:Name`` of `text2grad.core.critics` (default ``reward_model``, which takes
``{"path": ...}``). Writes ``report.json`` and ``judgments.jsonl`` to ``output_dir``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from reward_model.metrics import evaluate_feedback
from text2grad.apps.evaluation.compare_feedback_config import CompareConfig
from text2grad.apps.evaluation.judge import JudgeConfig, PairwiseItem, judge_pairwise, load_prompt, win_rate_summary
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.critics import build_critic
from text2grad.core.data import load_records
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_tokenizer

__all__ = ["render_feedback", "compare_critics", "run_compare", "main"]


def render_feedback(feedback: Feedback) -> str:
    """What the judge reads of one feedback: the critique (if any) and the quoted spans."""
    if not feedback.ok:
        return f"(no feedback: {feedback.error})"
    good = "; ".join(f'"{s}"' for s in feedback.good_spans) or "none"
    poor = "; ".join(f'"{s}"' for s in feedback.poor_spans) or "none"
    critique = f"Critique: {feedback.critique}\n" if feedback.critique.strip() else ""
    return f"{critique}Good spans: {good}\nPoor spans: {poor}"


def compare_critics(
    records: Sequence[dict[str, Any]],
    candidate: Sequence[Feedback],
    baseline: Sequence[Feedback],
    tokenizer,
    judge: JudgeConfig,
    template: str,
    seed: int = 0,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(report, per-item judgments) for two aligned lists of feedback on ``records``."""
    if not len(records) == len(candidate) == len(baseline):
        raise ValueError(f"got {len(records)} records, {len(candidate)} candidate and {len(baseline)} baseline feedbacks")
    items = [
        PairwiseItem(id=str(rec.get("id", i)), instruction=f"Prompt:\n{rec['prompt']}\n\nResponse:\n{rec['response']}",
                     candidate=render_feedback(c), baseline=render_feedback(b))
        for i, (rec, c, b) in enumerate(zip(records, candidate, baseline))
    ]
    judgments = judge_pairwise(items, judge, template, seed=seed, progress_bar=False)
    summary = win_rate_summary(judgments)
    n = summary["n_valid"] or float("nan")
    summary.update(win_share=summary["wins"] / n, tie_share=summary["ties"] / n, loss_share=summary["losses"] / n)
    references = [Feedback.from_dict(r) for r in records]
    responses = [str(r["response"]) for r in records]
    token_metrics = {
        name: evaluate_feedback(list(fbs), references, responses, tokenizer)[0].to_dict()
        for name, fbs in (("candidate", candidate), ("baseline", baseline))
    }
    return {"judge": summary, "token_metrics": token_metrics}, [j.to_dict() for j in judgments]


def run_compare(cfg: CompareConfig) -> int:
    if not cfg.dataset_path or not cfg.tokenizer:
        raise ConfigError("set --dataset_path (held-out annotations) and --tokenizer (for the token metrics)")
    records = load_records(cfg.dataset_path, required=("prompt", "response"), limit=cfg.limit)
    prompts, responses = [str(r["prompt"]) for r in records], [str(r["response"]) for r in records]
    feedback = {}
    try:  # a judge template, tokenizer, critic or critic kwargs that do not fit are the user's to fix
        template = load_prompt(cfg.judge_template)
        tokenizer = load_tokenizer(cfg.tokenizer)
        for name, critic_name, kwargs in (("candidate", cfg.candidate_critic, cfg.candidate_critic_kwargs),
                                          ("baseline", cfg.baseline_critic, cfg.baseline_critic_kwargs)):
            critic = build_critic(critic_name, kwargs, records=records)
            feedback[name] = list(critic.feedback(prompts, responses))
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
    judge = JudgeConfig(model=cfg.judge_model, base_url=cfg.base_url, api_key_env=cfg.api_key_env, concurrency=cfg.concurrency)
    report, judgments = compare_critics(records, feedback["candidate"], feedback["baseline"], tokenizer, judge, template, cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "judgments.jsonl").write_text("".join(json.dumps(j) + "\n" for j in judgments))
    s = report["judge"]
    print(f"candidate vs baseline: win {s['win_share']:.3f} : tie {s['tie_share']:.3f} : loss {s['loss_share']:.3f} "
          f"({s['n_valid']} judged, {s['failed']} failed); report: {out / 'report.json'}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(CompareConfig, run_compare, argv)


if __name__ == "__main__":
    sys.exit(main())
