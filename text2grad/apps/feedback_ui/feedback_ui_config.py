"""The configuration of ``text2grad feedback-ui`` (`FeedbackUIConfig`)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from annotation.annotation_config import DATASETS, DEFAULT_FIELD_MAPS
from text2grad.core.config import ConfigError, config_field, range_problems

__all__ = ["FeedbackUIConfig", "ANNOTATOR_PATTERN", "TOKEN_ENV", "is_loopback"]

# Annotator ids go into file names of nobody and URLs of everybody: letters, digits and . _ @ - only.
ANNOTATOR_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
# The access token may come from the environment, so that it never shows in `ps` or in a shell history.
TOKEN_ENV = "TEXT2GRAD_FEEDBACK_UI_TOKEN"


def is_loopback(host: str) -> bool:
    """True when ``host`` can only be reached from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class FeedbackUIConfig:
    """A local web page where people write critiques and mark good/poor spans; each submission is an annotation record.

    Serves the page by default. --agreement, --label_studio_dir and --import_label_studio instead do their one job
    on the files and exit.
    """

    # ---- data
    dataset_path: str = config_field(
        "",
        "Records to annotate (prompt, response): a .jsonl or .json file, a save_to_disk directory or a hub dataset id. "
        "Read only, never written.",
    )
    dataset_split: str = config_field("train", "Split to read from a hub dataset or a DatasetDict.")
    dataset: Literal["slf5k", "ultrafeedback", "kodcode"] = config_field(
        "ultrafeedback",
        "Which dataset's default field mapping to use (slf5k: prompt=post, response=generated_summary_for_feedback; "
        "ultrafeedback: prompt, response; kodcode: prompt=question, response=solution).",
    )
    field_map: dict[str, str] = config_field(
        {},
        "JSON object mapping our field names (prompt, response) to the input's, e.g. '{\"response\": \"prediction\"}' "
        "for an eval run's predictions.jsonl. Merged over the dataset's defaults.",
    )
    limit: int | None = config_field(None, "Offer only the first N input records.")
    output: str = config_field(
        "",
        "Annotation records are appended here (JSONL, the annotate command's layout with source 'human'). Restarting "
        "the command resumes; skipped items are remembered in <output>.skipped.jsonl.",
    )

    # ---- annotators
    annotator: str = config_field(
        "",
        "Default annotator id shown on the page (letters, digits, . _ @ -). Empty: the page asks each person for one.",
    )
    annotations_per_item: int = config_field(
        1,
        "How many different people annotate each item; 2 or more gives double-annotated items for --agreement.",
    )
    lease_minutes: float = config_field(
        30.0,
        "An item shown to someone is held for them this long (renewed while their page is open), so two people are "
        "never handed the same item at once.",
    )
    require_critique: bool = config_field(True, "Refuse a submission without a written critique.")
    max_critique_chars: int = config_field(20000, "Refuse a critique longer than this many characters (413).")
    annotators: str = config_field(
        "",
        "Give each annotator their own access token: a comma-separated list of ids (alice,bob) or a file with one id "
        "per line. Tokens are kept in <output>.tokens.json (readable by you only; reused on restart) with each "
        "person's address; a token acts for its id only. Replaces --access_token.",
    )

    reviewers: str = config_field(
        "",
        "Reviewer ids (comma-separated, or a file with one per line), each with their own token in "
        "<output>.tokens.json: they open <address>/review to adjudicate items two or more people annotated "
        "(adjudicated records go to <output>.adjudicated.jsonl).",
    )

    # ---- server
    host: str = config_field(
        "127.0.0.1",
        "Address to listen on. The default is reachable from this machine only; any other address requires an "
        "access token.",
    )
    port: int = config_field(8765, "Port to listen on (0: any free port; the address is printed).")
    access_token: str | None = config_field(
        None,
        f"Token every request must carry (the printed address includes it). Default: ${TOKEN_ENV} if set; with a "
        "non-loopback --host and neither, a random token is made. On 127.0.0.1 no token is needed unless given.",
    )

    # ---- reports and bridges
    agreement: bool = config_field(
        False,
        "Print the agreement summary of --output (token-level F1 of good and poor spans between annotators on items "
        "two or more people annotated; per critic, how often people kept, removed and added the spans it suggested), "
        "write it to <output>.agreement.json, and exit.",
    )
    label_studio_dir: str | None = config_field(
        None,
        "Write label_studio_config.xml (Labels good/poor over the response, a TextArea critique) and "
        "label_studio_tasks.json (the --dataset_path records as Label Studio tasks) into this folder, and exit.",
    )
    import_label_studio: str | None = config_field(
        None,
        "A Label Studio JSON export of a project set up with that config: its annotations are appended to --output "
        "as records (source 'human'), those already there are skipped, and the command exits.",
    )
    progress_bar: bool = config_field(True, "Show a progress bar while importing (stderr).")

    def __post_init__(self) -> None:
        problems = range_problems(
            self, positive=("annotations_per_item", "lease_minutes", "limit"), non_negative=("port",)
        )
        if self.port > 65535:
            problems.append(f"port must be at most 65535, got {self.port}")
        if self.annotator and not ANNOTATOR_PATTERN.match(self.annotator):
            problems.append(
                f"annotator {self.annotator!r} is not a valid id: use 1-64 letters, digits, '.', '_', '@' or '-', "
                "starting with a letter or digit"
            )
        if self.dataset not in DATASETS:
            problems.append(f"dataset must be one of {list(DATASETS)}, got {self.dataset!r}")
        if self.annotators and self.access_token:
            problems.append("--annotators gives each person their own token; drop --access_token")
        if self.max_critique_chars < 1:
            problems.append(f"max_critique_chars must be > 0, got {self.max_critique_chars}")
        if self.access_token is not None and len(self.access_token) < 16:
            problems.append("access_token must be at least 16 characters (or leave it unset to get a random one)")
        modes = [flag for flag, on in (("--agreement", self.agreement), ("--label_studio_dir", self.label_studio_dir),
                                       ("--import_label_studio", self.import_label_studio)) if on]
        if len(modes) > 1:
            problems.append(f"{' and '.join(modes)} are separate jobs; run the command once for each")
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def mode(self) -> str:
        if self.agreement:
            return "agreement"
        if self.label_studio_dir:
            return "label_studio_config"
        if self.import_label_studio:
            return "import_label_studio"
        return "serve"

    @property
    def skipped_path(self) -> Path:
        return Path(self.output + ".skipped.jsonl")

    @property
    def adjudicated_path(self) -> Path:
        return Path(self.output + ".adjudicated.jsonl")

    @property
    def tokens_path(self) -> Path:
        return Path(self.output + ".tokens.json")

    @property
    def agreement_path(self) -> Path:
        return Path(self.output + ".agreement.json")

    def resolved_field_map(self) -> dict[str, str]:
        """The dataset's default mapping with the user's --field_map over it."""
        return {**DEFAULT_FIELD_MAPS.get(self.dataset, {}), **self.field_map}
