"""The evaluation suites with ``--generation_backend vllm`` on the real engine: SmolLM2-135M-Instruct's greedy
summaries (chat template) and HumanEval completions (plain prompts, stop strings) through vLLM are the transformers
backend's, token for token, so every score computed from them (ROUGE, BLEU, pass@1) is the same; a LoRA policy is
served as a LoRA request and still matches the merged transformers model.

The engine tests are slow: they use the engine shared by the whole pytest run (`tests/vllm_testlib.py`; alone,
this file starts it, ~30-80 s on 2 CPU cores).
"""

from __future__ import annotations

import json

import pytest
from tests.vllm_testlib import engine_for_tests, engine_options, make_smollm2_lora_adapter

from text2grad.apps.evaluation import code as code_eval
from text2grad.apps.evaluation import summarization
from text2grad.core import generation_backend
from text2grad.core.assets import smollm2_path
from text2grad.core.data import iter_jsonl, write_jsonl

POSTS = [
    {"id": "p1", "title": "New job", "post": "I moved to Austin last month and I am looking for a job in design.",
     "reference": "Moved to Austin, looking for a design job."},
    {"id": "p2", "title": "Roommate", "post": "My roommate keeps eating my food and never buys groceries.",
     "reference": "Roommate eats my food and buys none."},
    {"id": "p3", "title": "Berlin?", "post": "I got an offer in Berlin but my family lives here. Should I go?",
     "reference": "Offer in Berlin, family here: should I move?"},
]


def _backend_args(backend: str) -> list[str]:
    if backend == "hf":
        return ["--generation_backend", "hf", "--device", "cpu"]
    return ["--generation_backend", "vllm", "--vllm_kwargs", json.dumps(engine_options())]


def _summarize(tmp_path, backend: str, *extra: str) -> tuple[list[dict], dict]:
    data, out = tmp_path / "eval.jsonl", tmp_path / backend
    write_jsonl(data, POSTS)
    rc = summarization.main([
        "--dataset_path", str(data), "--model", str(smollm2_path()), "--dtype", "fp32", "--use_chat_template", "true",
        "--prompt_template", "Summarize in one sentence.\n\n{post}", "--max_new_tokens", "24", "--metrics", "rouge,bleu",
        "--output_dir", str(out), "--progress_bar", "false", *_backend_args(backend), *extra,
    ])
    assert rc == 0
    return list(iter_jsonl(out / "predictions.jsonl")), json.loads((out / "summarization.json").read_text())["results"]


def test_missing_vllm_exits_2_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(generation_backend, "vllm_available", lambda: False)
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, POSTS[:1])
    rc = summarization.main(["--dataset_path", str(data), "--model", str(tmp_path / "m"), "--generation_backend", "vllm",
                             "--metrics", "rouge", "--output_dir", str(tmp_path / "out"), "--progress_bar", "false"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the vllm package" in err and "TEXT2GRAD_EXTRAS" in err


@pytest.mark.slow
def test_summaries_and_their_scores_are_the_same_with_vllm(tmp_path):
    engine_for_tests()  # skips without vllm; the CLI below gets this engine (same settings)
    hf_rows, hf_results = _summarize(tmp_path, "hf")
    vl_rows, vl_results = _summarize(tmp_path, "vllm")
    assert [r["prompt"] for r in vl_rows] == [r["prompt"] for r in hf_rows]
    assert [(r["prediction"], r["finished"]) for r in vl_rows] == [(r["prediction"], r["finished"]) for r in hf_rows]
    assert all(r["prediction"] for r in vl_rows)
    assert vl_results["rouge"] == hf_results["rouge"] and vl_results["bleu"] == hf_results["bleu"]
    assert (hf_results["generation_backend"], vl_results["generation_backend"]) == ("hf", "vllm")


@pytest.fixture(scope="module")
def lora_policy(tmp_path_factory):
    """A SmolLM2 LoRA policy adapter with non-zero weights (so it changes the summaries), saved as training saves it."""
    return make_smollm2_lora_adapter(tmp_path_factory.mktemp("policy_adapter"), seed=1)


@pytest.mark.slow
def test_a_lora_policy_writes_the_same_summaries_through_vllm(tmp_path, lora_policy):
    engine_for_tests()
    base_rows, _ = _summarize(tmp_path / "base", "vllm")
    hf_rows, hf_results = _summarize(tmp_path, "hf", "--adapter", str(lora_policy))
    vl_rows, vl_results = _summarize(tmp_path, "vllm", "--adapter", str(lora_policy))
    assert [r["prediction"] for r in vl_rows] == [r["prediction"] for r in hf_rows]
    assert vl_results["rouge"] == hf_results["rouge"]
    assert [r["prediction"] for r in vl_rows] != [r["prediction"] for r in base_rows]  # the adapter was applied


@pytest.mark.slow
def test_humaneval_completions_and_pass_at_1_are_the_same_with_vllm(tmp_path):
    engine_for_tests()
    reports, completions = {}, {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        rc = code_eval.main([
            "--benchmark", "humaneval", "--limit", "3", "--model", str(smollm2_path()), "--dtype", "fp32",
            "--max_new_tokens", "48", "--batch_size", "3", "--output_dir", str(out), "--progress_bar", "false",
            *_backend_args(backend),
        ])
        assert rc == 0
        completions[backend] = list(iter_jsonl(out / "humaneval_completions.jsonl"))
        reports[backend] = json.loads((out / "humaneval.json").read_text())["results"]
    assert completions["vllm"] == completions["hf"] and any(c["completion"].strip() for c in completions["hf"])
    assert reports["vllm"]["pass@1"] == reports["hf"]["pass@1"]
    assert reports["vllm"]["verdicts"] == reports["hf"]["verdicts"]
