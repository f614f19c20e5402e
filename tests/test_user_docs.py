"""The files a user reads speak about the project, and the README stays a guide.

Every tracked text file (docs, configs, scripts, code with its comments and docstrings) is read; none may point at
internal work items a user cannot look up: numbered issues or work sessions, or the people who worked on them. A
reference to another project's tracker is written as its URL (``https://github.com/<owner>/<repo>/issues/<n>``),
which these patterns do not match. ``tests/fixtures/`` holds data in the published datasets' own layouts and is
not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 260
TEXT_FILE = re.compile(r"\.(md|py|ya?ml|sh|toml|txt|cfg|ini|jinja|html)$")
NOT_CHECKED = ("tests/fixtures/",)
INTERNAL_REFERENCE = re.compile(
    "|".join(
        [
            r"\b[Ii]ssues? #?\d+",  # a numbered issue
            r"\b[Ii]ssue-\d+",
            r"\(#\d+\)",
            r"\b[Ss]essions? \d+",  # a numbered work session
            r"\b(?:[Tt]his|[Tt]hat|[Pp]revious|[Ee]arlier|[Oo]ther|[Ll]ast|[Nn]ext) (?:work |helper )?sessions?\b",
            r"\bsessions?'s? (?:default|code|tree|work|machine|figures?|notes?)\b",
            r"\b[Hh]elpers?' |\b[Hh]elper sessions?\b|\bother helpe[r]s\b|\bcoordinat[o]r\b",  # people, not code helpers
        ]
    )
)


def _tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [f for f in listed.splitlines() if TEXT_FILE.search(f) and not f.startswith(NOT_CHECKED)]


def internal_references(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) for every reference to an internal work item in ``text``."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in INTERNAL_REFERENCE.finditer(line)]


def test_no_user_facing_file_names_internal_work_items():
    files = _tracked_text_files()
    assert "README.md" in files and "text2grad/core/spans.py" in files and "env.sh" in files
    found = []
    for name in files:
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        found += [f"{name}:{line}: {words!r}" for line, words in internal_references(path.read_text(errors="replace"))]
    assert found == [], (
        "user-facing files name internal work items a user cannot look up; say what was measured or decided instead "
        "(e.g. 'measured: 1.0 vs 1.2 s per iteration on 2 cores, benchmarks/README.md'):\n" + "\n".join(found)
    )


def test_the_patterns_catch_internal_references_and_spare_ordinary_words():
    # built from pieces, so this file does not match itself
    caught = ["see iss" + "ue 18", "(Iss" + "ue 7)", "iss" + "ue #3", "the iss" + "ue-17 section", "fixed in (#" + "12)",
              "Sess" + "ion 5's default", "re-timed in this sess" + "ion", "other sess" + "ions' jobs",
              "two help" + "ers' jobs", "the coord" + "inator merges it"]
    spared = ["a new session, killed as a group", 'scope="session"', "shared helpers of the tests",
              "https://github.com/huggingface/trl/issues/419", "issues found with real rows", "Issue a warning"]
    assert [text for text in caught if not internal_references(text)] == []
    assert [text for text in spared if internal_references(text)] == []


def test_readme_is_a_guide_of_at_most_260_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move details into the package READMEs "
        "or benchmarks/README.md and link them"
    )


# How the method study's report opens its generated sentences (benchmarks/method_study_report.py). A bullet in the
# benchmark notes that opens the same way quotes the report, and must still read as the committed study.md does:
# a number typed or left behind by hand is caught here.
GENERATED_OPENINGS = (
    "Task instance", "Pooled over the", "With learned feedback", "With oracle feedback", "The 3 instances",
    "The 2 instances", "The instances disagree", "Over the ", "Early-stopped on validation",
    "Text2Grad reached that", "At the end,", "On the SFT", "Text2Grad itself ends", "The study's goal (",
    "The learned critics",
)


def stale_quotes(notes: str, reports: str) -> list[tuple[int, str]]:
    """(line number, sentence) for each bullet of ``notes`` that opens like a generated sentence of the method
    study's report but is not, word for word, in ``reports`` (the committed study.md files together)."""
    quoted = [(n, m.group(1)) for n, line in enumerate(notes.splitlines(), 1)
              if (m := re.match(r"\s*- (.+)$", line)) and m.group(1).startswith(GENERATED_OPENINGS)]
    return [(n, sentence) for n, sentence in quoted if sentence not in reports]


def test_a_quoted_study_sentence_is_caught_once_its_number_no_longer_matches():
    reports = "Pooled over the 3 instances (15 seed pairs): +0.044 (ahead on 9 of 15).\nTask instance 0: ahead."
    notes = ("Intro written by hand.\n- Pooled over the 3 instances (15 seed pairs): +0.044 (ahead on 9 of 15).\n"
             "- Task instance 0: behind.\n- A hand-written bullet is not a quote.\n")
    assert stale_quotes(notes, reports) == [(3, "Task instance 0: behind.")]


def test_the_benchmark_notes_quote_the_committed_study_reports_word_for_word():
    reports = "\n".join(p.read_text() for p in sorted((ROOT / "benchmarks" / "results").glob("*/study.md")))
    assert reports, "no committed study.md under benchmarks/results"
    stale = stale_quotes((ROOT / "benchmarks" / "README.md").read_text(), reports)
    assert stale == [], (
        "benchmarks/README.md quotes sentences of the method study's report that its committed study.md no longer "
        "says; copy the current sentence from benchmarks/results/<study>/study.md (after `--phases report "
        "--export_to ...`):\n" + "\n".join(f"benchmarks/README.md:{n}: {s[:160]}" for n, s in stale)
    )
