"""The ``text2grad`` command: one entry point that lists and dispatches to every phase's CLI.

Each subcommand is an ordinary module with a ``main(argv)`` function, so ``text2grad annotate ...`` and
``python -m text2grad.annotate ...`` are the same program.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Sequence

from text2grad.core.cli import EXIT_OK, EXIT_USAGE, guarded, print_error
from text2grad.core.config import invoked_as, version
from text2grad.core.critics import load_object

# subcommand -> (module with main(argv), one-line description)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("text2grad.apps.quickstart", "Run all three phases offline on a generated toy task (the embedded default)."),
    "prepare-data": ("text2grad.apps.prepare_data", "Phase 0: the paper's datasets (hub id or local copy) -> the files each phase reads."),
    "annotate": ("annotation.cli", "Phase 1: annotate (prompt, response) records with critiques and good/poor spans."),
    "feedback-ui": ("text2grad.apps.feedback_ui", "Phase 1 by hand: a local web page where people critique responses and mark spans."),
    "train-rm": ("reward_model.train", "Phase 2: train the generative reward model (LoRA or full)."),
    "eval-rm": ("reward_model.evaluate", "Phase 2: evaluate a reward model on held-out annotations."),
    "merge-rm": ("reward_model.merge", "Phase 2: merge a LoRA reward model into its base model."),
    "serve-critic": ("reward_model.serve", "Phase 2: serve a trained reward model from vLLM's OpenAI server (PPO critic backend openai)."),
    "train-scalar-rm": ("reward_model.scalar", "Phase 2 baseline: scalar Bradley-Terry reward model on preference pairs (PPO baseline)."),
    "sft": ("policy_optimization.sft", "Phase 3: supervised fine-tuning of the policy (TRL SFTTrainer)."),
    "train-policy": ("policy_optimization.train", "Phase 3: Text2Grad PPO (or the scalar/dense/score_spread/mixed modes)."),
    "train-grpo": ("policy_optimization.grpo", "Phase 3 variant: Text2Grad-GRPO (group advantages + span rewards per token)."),
    "dpo": ("policy_optimization.dpo", "Phase 3 baseline: DPO on chosen/rejected pairs (TRL DPOTrainer)."),
    "code-pairs": ("policy_optimization.code_pairs", "Phase 3 baseline: KodCode DPO pairs from unit tests run in the sandbox."),
    "eval-summarization": ("text2grad.apps.evaluation.summarization", "Evaluate a policy on SLF5K-style summarization."),
    "eval-code": ("text2grad.apps.evaluation.code", "Evaluate a policy on HumanEval/MBPP(+) in the sandbox (pass@k)."),
    "eval-qa": ("text2grad.apps.evaluation.qa", "Evaluate a policy on ARC-Challenge and judged QA (AlpacaEval/MT-Bench style)."),
    "compare-feedback": ("text2grad.apps.evaluation.compare_feedback", "Compare two critics' feedback: LLM-judge pairwise win rate + token metrics."),
}


def available() -> dict[str, tuple[str, str]]:
    """Subcommands whose module exists in this installation."""
    out = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            out[name] = (module, help_text)
    return out


def usage() -> str:
    commands = available()
    width = max(len(n) for n in commands) if commands else 0
    lines = [
        "usage: text2grad <command> [options]   (text2grad <command> --help for its options)",
        "       text2grad --version",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {help_text}" for name, (_, help_text) in commands.items()]
    return "\n".join(lines)


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return EXIT_OK
    if argv and argv[0] == "--version":
        print(f"text2grad {version()}")
        return EXIT_OK
    if not argv:
        print(usage(), file=sys.stderr)
        print_error("no command given; pick one of the commands above")
        return EXIT_USAGE
    commands = available()
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(usage(), file=sys.stderr)
        print_error(f"unknown command {name!r}; pick one of the commands above")
        return EXIT_USAGE
    command_main = load_object(f"{commands[name][0]}:main")  # the one by-name loader (README: conventions)
    with invoked_as(f"text2grad {name}"):
        return int(command_main(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``text2grad <command> ...``: run the command's ``main`` with the rest of the arguments, its usage lines
    naming ``text2grad <command>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return guarded(lambda: _dispatch(argv))


if __name__ == "__main__":
    sys.exit(main())
