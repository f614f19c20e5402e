"""Fixtures for the annotation tests: an API key in the environment, and the CLI run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.annotation.annotation_test_utils import SECRET_KEY

from annotation.cli import main


@pytest.fixture
def api_key(monkeypatch) -> str:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return SECRET_KEY


@pytest.fixture
def run_cli(api_key):
    """Run ``annotation.cli.main`` with common fast settings; returns (exit code, report dict)."""
    def run(server, tmp_path: Path, *extra: str, input_path: Path | None = None, output: Path | None = None):
        output = output or tmp_path / "out.jsonl"
        args = [
            "--dataset_path", str(input_path or tmp_path / "in.jsonl"),
            "--output", str(output),
            "--base_url", server.base_url,
            "--backoff_base_s", "0.01",
            "--backoff_max_s", "0.05",
            "--timeout_s", "5",
            "--progress_bar", "false",
            *extra,
        ]
        rc = main(args)
        report_path = Path(str(output) + ".report.json")
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        return rc, report

    return run
