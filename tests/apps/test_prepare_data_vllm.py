"""Sampling the responses to annotate (prepare-data's KodCode completions) with ``--generation_backend vllm`` on the
real engine: SmolLM2-135M-Instruct's greedy completions through vLLM are the transformers backend's, so the
annotation records and their sandbox verdicts are the same.

Slow: it uses the engine shared by the whole pytest run (`tests/vllm_testlib.py`; alone, this file starts it).
"""

from __future__ import annotations

import json

import pytest
from tests.apps.test_prepare_data import FIXTURES, prepare, read
from tests.vllm_testlib import engine_for_tests, engine_options

from text2grad.core import generation_backend
from text2grad.core.assets import smollm2_path


def test_missing_vllm_exits_2_before_any_model_loads(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(generation_backend, "vllm_available", lambda: False)
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode"),
                      "--completions_model", str(tmp_path / "no-such-model"), "--generation_backend", "vllm")
    assert rc == 2 and "needs the vllm package" in capsys.readouterr().err
    assert not (out / "prepare_report.json").exists()


@pytest.mark.slow
def test_kodcode_completions_and_their_verdicts_are_the_same_with_vllm(tmp_path):
    engine_for_tests()  # skips without vllm; the command below gets this engine (same settings)
    records, reports = {}, {}
    for backend, extra in (("hf", []), ("vllm", ["--vllm_kwargs", json.dumps(engine_options())])):
        rc, out = prepare(
            tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode"), "--fractions", '{"rm": 1.0}',
            "--completions_model", str(smollm2_path()), "--dtype", "fp32", "--temperature", "0", "--max_new_tokens", "40",
            "--test_timeout_s", "5", "--generation_backend", backend, *extra, out=backend,
        )
        assert rc == 0
        records[backend] = [r for r in read(out, "annotation_input.jsonl") if r["kind"] == "completion"]
        reports[backend] = json.loads((out / "prepare_report.json").read_text())
    assert len(records["hf"]) == 4 and any(r["response"].strip() for r in records["hf"])
    assert [(r["id"], r["response"]) for r in records["vllm"]] == [(r["id"], r["response"]) for r in records["hf"]]
    assert [r["execution"]["verdict"] for r in records["vllm"]] == [r["execution"]["verdict"] for r in records["hf"]]
    assert reports["vllm"]["programs"] == reports["hf"]["programs"]
