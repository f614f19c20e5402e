"""The ``text2grad`` command: one entry point that lists and dispatches to every phase's CLI.

Each subcommand is an ordinary module with a ``main(argv)`` function, so ``text2grad annotate ...`` and
``python -m text2grad.annotate ...`` are the same program. ``text2grad <command> --help`` reads only the command's
config dataclass, which imports no ML library, so the options print at once.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import NamedTuple, Sequence

from text2grad.core.cli import EXIT_OK, EXIT_USAGE, guarded, print_error
from text2grad.core.config import invoked_as, parse_config, version
from text2grad.core.critics import load_object

HELP_FLAGS = {"-h", "--help"}


class Subcommand(NamedTuple):
    """A ``text2grad`` subcommand: the module whose ``main(argv)`` runs it, its config dataclass ("module:Class",
    read alone for ``--help``, so the options print without loading the command's libraries) and one line of help."""

    module: str
    config: str
    help: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "quickstart": Subcommand(
        "text2grad.apps.quickstart", "text2grad.apps.quickstart.quickstart_config:QuickstartConfig",
        "Run all three phases offline on a generated toy task (the embedded default).",
    ),
    "prepare-data": Subcommand(
        "text2grad.apps.prepare_data", "text2grad.apps.prepare_data.prepare_data_config:PrepareDataConfig",
        "Phase 0: the paper's datasets (hub id or local copy) -> the files each phase reads.",
    ),
    "annotate": Subcommand(
        "annotation.cli", "annotation.annotation_config:AnnotationConfig",
        "Phase 1: annotate (prompt, response) records with critiques and good/poor spans.",
    ),
    "feedback-ui": Subcommand(
        "text2grad.apps.feedback_ui", "text2grad.apps.feedback_ui.feedback_ui_config:FeedbackUIConfig",
        "Phase 1 by hand: a local web page where people critique responses and mark spans.",
    ),
    "train-rm": Subcommand(
        "reward_model.train", "reward_model.train_config:RewardModelConfig",
        "Phase 2: train the generative reward model (LoRA or full).",
    ),
    "eval-rm": Subcommand(
        "reward_model.evaluate", "reward_model.evaluate_config:EvalConfig",
        "Phase 2: evaluate a reward model on held-out annotations.",
    ),
    "merge-rm": Subcommand(
        "reward_model.merge", "reward_model.merge_config:MergeConfig",
        "Phase 2: merge a LoRA reward model into its base model.",
    ),
    "serve-critic": Subcommand(
        "reward_model.serve", "reward_model.serve_config:ServeCriticConfig",
        "Phase 2: serve a trained reward model from vLLM's OpenAI server (PPO critic backend openai).",
    ),
    "train-scalar-rm": Subcommand(
        "reward_model.scalar", "reward_model.scalar_config:ScalarRMConfig",
        "Phase 2 baseline: scalar Bradley-Terry reward model on preference pairs (PPO baseline).",
    ),
    "sft": Subcommand(
        "policy_optimization.sft", "policy_optimization.sft_config:SFTRunConfig",
        "Phase 3: supervised fine-tuning of the policy (TRL SFTTrainer).",
    ),
    "train-policy": Subcommand(
        "policy_optimization.train", "policy_optimization.ppo_config:PPOConfig",
        "Phase 3: Text2Grad PPO (or the scalar/dense/score_spread/mixed modes).",
    ),
    "train-grpo": Subcommand(
        "policy_optimization.grpo", "policy_optimization.grpo_config:GRPORunConfig",
        "Phase 3 variant: Text2Grad-GRPO (group advantages + span rewards per token).",
    ),
    "dpo": Subcommand(
        "policy_optimization.dpo", "policy_optimization.dpo_config:DPORunConfig",
        "Phase 3 baseline: DPO on chosen/rejected pairs (TRL DPOTrainer).",
    ),
    "code-pairs": Subcommand(
        "policy_optimization.code_pairs", "policy_optimization.code_pairs_config:CodePairsConfig",
        "Phase 3 baseline: KodCode DPO pairs from unit tests run in the sandbox.",
    ),
    "eval-summarization": Subcommand(
        "text2grad.apps.evaluation.summarization", "text2grad.apps.evaluation.summarization_config:SummarizationEvalConfig",
        "Evaluate a policy on SLF5K-style summarization.",
    ),
    "eval-code": Subcommand(
        "text2grad.apps.evaluation.code", "text2grad.apps.evaluation.code.code_eval_config:CodeEvalConfig",
        "Evaluate a policy on HumanEval/MBPP(+) in the sandbox (pass@k).",
    ),
    "eval-qa": Subcommand(
        "text2grad.apps.evaluation.qa", "text2grad.apps.evaluation.qa_config:QAEvalConfig",
        "Evaluate a policy on ARC-Challenge and judged QA (AlpacaEval/MT-Bench style).",
    ),
    "compare-feedback": Subcommand(
        "text2grad.apps.evaluation.compare_feedback", "text2grad.apps.evaluation.compare_feedback_config:CompareConfig",
        "Compare two critics' feedback: LLM-judge pairwise win rate + token metrics.",
    ),
}


def available() -> dict[str, Subcommand]:
    """Subcommands whose module exists in this installation."""
    out = {}
    for name, sub in SUBCOMMANDS.items():
        try:
            found = importlib.util.find_spec(sub.module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            out[name] = sub
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
    lines += [f"  {name.ljust(width)}  {sub.help}" for name, sub in commands.items()]
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
    sub = commands[name]
    with invoked_as(f"text2grad {name}"):
        if HELP_FLAGS & set(rest):  # argparse prints the help and exits: the command's own parser, built alone
            parse_config(load_object(sub.config), rest)
        command_main = load_object(f"{sub.module}:main")  # the one by-name loader (README: conventions)
        return int(command_main(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``text2grad <command> ...``: run the command's ``main`` with the rest of the arguments, its usage lines
    naming ``text2grad <command>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return guarded(lambda: _dispatch(argv))


if __name__ == "__main__":
    sys.exit(main())
