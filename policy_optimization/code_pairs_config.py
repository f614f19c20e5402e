"""The configuration of `python -m policy_optimization.code_pairs` (`CodePairsConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from text2grad.core.config import ConfigError, config_field

__all__ = ["CodePairsConfig"]


@dataclass
class CodePairsConfig:
    """Chosen/rejected program pairs from unit tests run in the sandbox."""

    dataset_path: str = config_field("", "Records with a question, unit tests and candidate programs: .jsonl/.json, saved dataset or hub id.")
    output: str = config_field("", "Where the pairs go (JSONL with id, question, chosen, rejected and the verdicts).")
    dataset_split: str = config_field("train", "Split for hub datasets.")
    field_map: dict[str, str] = config_field({}, "Rename record fields, {our_name: their_name}.")
    question_field: str = config_field("question", "The field holding the problem statement.")
    tests_field: str = config_field("test", "The field holding the unit tests (pytest-style module or plain asserts).")
    candidate_fields: list[str] = config_field(["solution"], "Fields holding candidate programs (a string or a list each).")
    max_pairs_per_question: int = config_field(1, "At most this many pairs per question.")
    timeout_s: float = config_field(10.0, "Time limit of one candidate's test run in the sandbox.")
    memory_mb: int = config_field(1024, "Address-space limit of one test run.")
    workers: int = config_field(2, "Test runs in parallel (each is its own sandboxed process tree).")
    max_samples: int | None = config_field(None, "Use only the first N records.")
    progress_bar: bool = config_field(True, "Show a progress bar over the test runs.")

    def __post_init__(self) -> None:
        if not self.candidate_fields:
            raise ConfigError("candidate_fields is empty; name at least one field that holds candidate programs")
        for name, value in (("max_pairs_per_question", self.max_pairs_per_question), ("workers", self.workers)):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
