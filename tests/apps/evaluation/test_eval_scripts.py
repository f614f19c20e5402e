"""scripts/eval_slf5k.sh and scripts/eval_ultrafeedback.sh run end to end on the tiny world (TEXT2GRAD_TINY=1),
with the judged suites pointed at the loopback fake judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fake_openai import FakeOpenAIServer

from text2grad.apps.evaluation.summarization import default_bertscore_model

ROOT = Path(__file__).resolve().parents[3]


def _judge(body, n):
    user = body["messages"][-1]["content"]
    return "Rating: [[6]]" if "Rating: [[5]]" in user else "Both are the same.\nVerdict: tie"


def _run(script: str, tmp_path: Path, server) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODEL", "DATA", "ADAPTER", "BASELINE", "PREDICTIONS"))}
    env.update(TEXT2GRAD_TINY="1", TINY_DIR=str(tmp_path / "tiny"), OUTPUT_DIR=str(tmp_path / "out"), PYTHON=sys.executable,
               JUDGE_MODEL="fake-judge", JUDGE_BASE_URL=server.base_url, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_eval_slf5k_script_tiny(tmp_path):
    with FakeOpenAIServer(_judge) as server:
        _run("eval_slf5k.sh", tmp_path, server)
        assert len(server.requests) == 8  # one judgment per tiny eval record
    results = json.loads((tmp_path / "out" / "summarization.json").read_text())["results"]
    assert results["n"] == 8 and set(results["rouge"]) == {"rouge1", "rouge2", "rougeL"}
    assert results["perplexity"] > 1.0 and 0.0 <= results["bertscore"]["f1"] <= 1.0
    assert results["judge"]["ties"] == 8 and results["judge"]["win_rate"] == 0.5
    assert (tmp_path / "out" / "predictions.jsonl").is_file()
    # BERTScores from different models are not comparable, so both reports must say which model made this one

    model_path, layer = default_bertscore_model()
    assert (results["bertscore"]["model"], results["bertscore"]["num_layers"]) == (model_path, layer)
    markdown = (tmp_path / "out" / "summarization.md").read_text()
    assert f"BERTScore F1 (all-MiniLM-L6-v2 (bundled), layer {layer})" in markdown
    assert f"BERTScore used all-MiniLM-L6-v2 (bundled) layer {layer}" in markdown


@pytest.mark.slow
def test_eval_ultrafeedback_script_tiny(tmp_path):
    with FakeOpenAIServer(_judge) as server:
        proc = _run("eval_ultrafeedback.sh", tmp_path, server)
        assert len(server.requests) == 8 + 4 * 2  # AlpacaEval items + MT-Bench turns
    out = tmp_path / "out"
    arc = json.loads((out / "arc.json").read_text())["results"]
    assert arc["n"] == 8 and 0.0 <= arc["accuracy"] <= 1.0
    alpaca = json.loads((out / "alpaca_eval.json").read_text())["results"]
    assert alpaca["ties"] == 8 and alpaca["win_rate"] == 0.5
    mt = json.loads((out / "mt_bench.json").read_text())["results"]
    assert mt["score"] == 6.0 and mt["per_turn"] == {"1": 6.0, "2": 6.0}
    assert "skipped" not in proc.stdout
