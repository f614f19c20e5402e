"""The per-dataset annotation scripts run end to end offline (TEXT2GRAD_TINY=1) on the hand-written rows in each
dataset's real layout (tests/fixtures/<dataset>): prepare-data, then annotation, exactly as on the real data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    "dataset, critic, source",
    [("slf5k", "human", "human+llm:gpt-4o"), ("ultrafeedback", "", "llm:gpt-4o"), ("kodcode", "code_tests", "code_tests")],
)
def test_annotation_script_tiny_mode(tmp_path, dataset, critic, source):
    env = {**os.environ, "TEXT2GRAD_TINY": "1", "TINY_DIR": str(tmp_path), "CRITIC": critic,
           "PYTHON": sys.executable, "INPUT": str(REPO / "tests" / "fixtures" / dataset)}
    env.pop("OPENAI_API_KEY", None)  # the offline run must not need (or send) a key
    proc = subprocess.run(["bash", f"scripts/annotate_{dataset}.sh", "--concurrency", "4"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / f"annotations.{critic or 'llm'}.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # the records prepare-data wrote from the tiny native-layout data (the same command a real run uses)
    data = [json.loads(line) for line in (tmp_path / "data" / "annotation_input.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(d["id"] for d in data)
    assert all(r["source"] == source for r in records)
    assert all(s in r["response"] for r in records for s in r["good_spans"] + r["poor_spans"])
    assert sum(len(r["good_spans"]) + len(r["poor_spans"]) for r in records) > 0
    if critic == "human":
        feedback = {d["id"]: d["feedback"] for d in data}
        assert all(r["critique"] == feedback[r["id"]] for r in records)
    if critic == "code_tests":
        assert all(r["meta"]["_annotation"]["verdict"] in ("passed", "failed", "crashed", "timeout") for r in records)
        # references and the tiny model's completions: both passing and failing programs were annotated
        kinds = {(r["meta"]["kind"], r["meta"]["_annotation"]["verdict"] == "passed") for r in records}
        assert ("reference", True) in kinds and ("completion", False) in kinds
        prepared = json.loads((tmp_path / "data" / "prepare_report.json").read_text())
        assert prepared["passing"] > 0 and prepared["failing"] > 0
    if dataset == "ultrafeedback":  # both answers of each pair, each under its own id
        assert {r["id"].rsplit(":", 1)[1] for r in records} == {"chosen", "rejected"}
        assert len({r["id"] for r in records}) == len(records)
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["complete"] and report["done"] == len(data)
