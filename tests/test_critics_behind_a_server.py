"""Critics behind a real OpenAI-compatible server: vLLM's, serving SmolLM2-135M-Instruct on a CPU, started once per
pytest run (`tests.critic_server`, what ``text2grad serve-critic`` runs). All of them use that one server:

- the reward model's ``backend="openai"`` writes, greedy, the very tokens the transformers backend writes with the
  same weights, and a PPO iteration runs with it as the critic;
- a dead server, a wrong model name and a timeout each give a clear error and lose no pair or record;
- ``text2grad annotate --base_url`` on real-layout SLF5K rows with structured outputs (the server keeps to the
  span JSON schema), killed and resumed;
- the pairwise judge in both orders.

SmolLM2 is not a trained reward model: its critiques are poor, so the tests check the plumbing (requests, ids,
counts, records), not the critiques' quality.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.reward_model.grounding_testlib import SPAN_LIST_OPENING, RowConstraints, forced_span_list

from annotation.cli import main as annotate
from policy_optimization.models import ValueModel
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel, json_complete
from reward_model.remote import RemoteCompletions, RemoteError
from reward_model.serve import free_port
from text2grad.apps.evaluation.judge import JudgeConfig, PairwiseItem, judge_pairwise, load_prompt, win_rate_summary
from text2grad.core.critics import build_critic
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.modeling import build_tiny_llama
from text2grad.core.vllm_engine import request_constraint_xargs

# one real model on a CPU shared with other work: a test can take many minutes under load (15 on a 2-core machine at
# load 15), so the time limit is twice the suite's
pytestmark = [pytest.mark.slow, pytest.mark.vllm_server, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
SLF5K = REPO / "tests" / "fixtures" / "slf5k"
PROMPTS = ["Summarize: the cat sat on the mat all day.", "Summarize: Oslo is the capital of Norway.",
           "Summarize: the shop opens at nine.", "Summarize: water boils at 100 degrees."]
RESPONSES = ["A cat sat on a mat.", "Oslo is Norway's capital.", "The shop opens at ten.", "Water boils at 90 degrees."]
FAST_RETRIES = {"max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.05}


def _remote(server, **kwargs) -> GenerativeRewardModel:
    options = dict(backend="openai", base_url=server.base_url, model=server.model, max_new_tokens=32)
    return GenerativeRewardModel.from_pretrained(str(server.model_dir), **{**options, **kwargs})


@pytest.fixture(scope="module")
def local(critic_server) -> GenerativeRewardModel:
    """The served weights in this process (the transformers backend), for the tests that compare with it."""
    return GenerativeRewardModel.from_pretrained(str(critic_server.model_dir), max_new_tokens=32, batch_size=1,
                                                 dtype="fp32")


@pytest.fixture
def one_torch_thread():
    """This process's generation on one thread: on a 2-core machine shared with other work (the server's engine
    among it), torch's two threads keep waiting for each other, 3 to 5 times slower per token than one (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------
# The reward model's remote backend
# --------------------------------------------------------------------------------------------------


def test_remote_critiques_equal_the_local_backend_token_for_token(critic_server, local, one_torch_thread):
    remote = _remote(critic_server)
    inputs = local._inputs(PROMPTS, RESPONSES)
    assert [i.text for i in remote._inputs(PROMPTS, RESPONSES)] == [i.text for i in inputs]
    # what the "hf" backend generates (its `_generate`: greedy, stopping at the end of the span JSON), one row per
    # batch so that it computes what the server computes (no padding) and greedy decoding cannot tip over a near-tie
    reference = [generate(local.model, local.tokenizer, [i.text], max_new_tokens=32, batch_size=1,
                          add_special_tokens=i.add_special_tokens, stop_fn=json_complete)[0] for i in inputs]

    # the reward model's own path (render, send, decode, cut at the JSON, parse), with what it sent and what the
    # server answered recorded on the way
    sent, send = [], remote.engine.generate

    def recorded(ids, *args, **kwargs):
        sent.append((ids, send(ids, *args, **kwargs)))
        return sent[-1][1]

    remote.engine.generate = recorded
    feedback = remote.feedback(PROMPTS, RESPONSES)
    assert len(sent) == 1
    ids, served = sent[0]
    assert ids == [local.tokenizer(i.text, add_special_tokens=i.add_special_tokens)["input_ids"] for i in inputs]
    assert all(s.error is None and s.token_ids for s in served)
    assert [s.token_ids[: len(r.response_ids)] for s, r in zip(served, reference)] == [r.response_ids for r in reference]
    # decoded and cut as the local backend's outputs, in order (a critique keeps what was written as its raw text)
    assert [f.raw for f in feedback] == [r.text for r in reference]
    assert remote.stats.truncated == sum(not r.finished for r in reference)
    assert remote.stats.requests == 4 and remote.stats.request_errors == 0


def test_grounded_quotes_are_constrained_inside_the_server_as_in_process(critic_server, local, one_torch_thread):
    """The server runs the project's per-request logits processor (serve-critic installs it): a constraint sent in a
    request's vllm_xargs constrains that request as the transformers logits processor constrains a row. SmolLM2 was
    not trained to write span JSON, so the test constraint forces the span list open, then hands over to the reward
    model's grounded constraint (tests/reward_model/grounding_testlib.py)."""
    tokenizer, model = local.tokenizer, local.model
    sources = ["Oslo is the capital of Sweden.", "Water boils at 90 degrees."]
    prompts = [apply_chat_template(tokenizer, f"Quote the wrong words in: {s}") for s in sources]
    ids = encode_prompt_ids(tokenizer, prompts, add_special_tokens=False)
    remote = RemoteCompletions(critic_server.base_url, critic_server.model)
    served = remote.generate(ids, 24, extra_bodies=[
        {"vllm_xargs": request_constraint_xargs("tests.reward_model.grounding_testlib:forced_span_list", source=s)}
        for s in sources])
    local = generate(model, tokenizer, prompts, max_new_tokens=24, batch_size=1, add_special_tokens=False,
                     logits_processors=lambda rows, width: [RowConstraints([forced_span_list(tokenizer, sources[i])
                                                                            for i in rows], width)])
    assert [s.token_ids[: len(h.response_ids)] for s, h in zip(served, local)] == [h.response_ids for h in local]
    assert all(s.text.startswith(SPAN_LIST_OPENING) for s in served)
    # and through the reward model: grounded_spans sends the grounded constraint with every request
    rm = _remote(critic_server, grounded_spans=True, max_new_tokens=16)
    assert len(rm.feedback(PROMPTS[:2], RESPONSES[:2])) == 2 and rm.stats.request_errors == 0


def test_a_ppo_iteration_runs_with_the_critic_behind_the_server(critic_server, bpe_tokenizer, tmp_path):
    critic = build_critic("reward_model", {"path": str(critic_server.model_dir), "backend": "openai",
                                           "base_url": critic_server.base_url, "model": critic_server.model,
                                           "max_new_tokens": 24})
    cfg = PPOConfig(num_iterations=1, batch_size=4, num_mini_batches=1, num_ppo_epochs=1, response_length=8,
                    learning_rate=1e-3, seed=0, save_steps=0, progress_bar=False, log_samples=0,
                    max_feedback_error_rate=1.0, output_dir=str(tmp_path / "ppo"))
    policy = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    value = ValueModel.from_causal_lm(build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=1))
    trainer = NLGradientPPOTrainer(cfg, bpe_tokenizer, policy, None, value, critic, [{"prompt": p} for p in PROMPTS])
    trainer.train()
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1]
    assert critic.stats.requests == 4 and critic.stats.request_errors == 0  # every sample was asked of the server
    # what the server wrote is what PPO counted: a critique that did not parse is a feedback error (unless the
    # policy's response was empty, which PPO counts as the policy's doing)
    m = metrics[0]
    assert m["samples/feedback_error"] <= critic.stats.malformed <= m["samples/feedback_error"] + m["samples/empty"]


def test_a_dead_server_fails_clearly_at_start_and_per_pair_at_run_time(critic_server):
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    with pytest.raises(RemoteError, match=r"cannot reach the critic server at .*is it running"):
        _remote(critic_server, base_url=dead)
    rm = _remote(critic_server, base_url=dead, check_server=False, server_kwargs=FAST_RETRIES)
    feedback = rm.feedback(PROMPTS, RESPONSES)
    assert len(feedback) == 4 and not any(f.ok for f in feedback)  # one failed Feedback per pair, none lost
    assert all("APIConnectionError from the critic server" in f.error and "gave up after 2 attempts" in f.error
               for f in feedback)
    assert rm.stats.request_errors == 4 and rm.engine.retries == 4


def test_a_wrong_model_name_fails_naming_the_served_models(critic_server):
    with pytest.raises(RemoteError, match=rf"does not serve a model named 'no-such-model'.*'{critic_server.model}'"):
        _remote(critic_server, model="no-such-model")
    rm = _remote(critic_server, model="no-such-model", check_server=False, server_kwargs=FAST_RETRIES)
    feedback = rm.feedback(PROMPTS[:2], RESPONSES[:2])
    assert [f.ok for f in feedback] == [False, False]
    assert all("HTTP 404" in f.error and "no-such-model" in f.error for f in feedback)
    assert rm.engine.retries == 0  # a wrong name is not retried


def test_a_timeout_fails_each_pair_clearly(critic_server):
    rm = _remote(critic_server, max_new_tokens=400, server_kwargs={**FAST_RETRIES, "timeout_s": 0.05})
    feedback = rm.feedback(PROMPTS[:2], RESPONSES[:2])
    assert [f.ok for f in feedback] == [False, False]
    assert all("APITimeoutError" in f.error and "gave up after 2 attempts" in f.error for f in feedback)


def test_a_server_key_is_required_and_never_shown(critic_server, monkeypatch):
    # the test run's server runs without a key, so any key is accepted; the key must not leak into errors
    monkeypatch.setenv("CRITIC_KEY_FOR_TEST", "sk-test-secret-critic-key-123456")
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    rm = _remote(critic_server, base_url=dead, check_server=False, api_key_env="CRITIC_KEY_FOR_TEST",
                 server_kwargs=FAST_RETRIES)
    (fb,) = rm.feedback(PROMPTS[:1], RESPONSES[:1])
    assert not fb.ok and "sk-test-secret-critic-key-123456" not in fb.error


# --------------------------------------------------------------------------------------------------
# Annotation and the judge through the same server
# --------------------------------------------------------------------------------------------------


def _slf5k_rows(path: Path) -> Path:
    """Real-layout SLF5K rows, the fixture's first of train and first of validation, in one file: one for the run
    that is killed after its first record, one for the resumed run (each row is a request of a few seconds)."""
    rows = [json.loads((SLF5K / name).read_text().splitlines()[0]) for name in ("train.jsonl", "validation.jsonl")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _annotate_args(server, data: Path, out: Path) -> list[str]:
    return ["--dataset", "slf5k", "--dataset_path", str(data), "--output", str(out), "--base_url", server.base_url,
            "--model", server.model, "--max_tokens", "32", "--concurrency", "1", "--max_retries", "0",
            "--timeout_s", "1200", "--progress_bar", "false"]


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.exists() else []


def test_annotation_with_structured_outputs_is_killed_and_resumed(critic_server, tmp_path):
    data = _slf5k_rows(tmp_path / "slf5k.jsonl")
    n = len(data.read_text().splitlines())
    out = tmp_path / "annotations.jsonl"
    failures = Path(str(out) + ".failures.jsonl")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "text2grad.annotate", *_annotate_args(critic_server, data, out)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(_ids(out)) + len(_ids(failures)) < 1:  # kill it once the first record has landed
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
        assert time.monotonic() < deadline, "no record was written within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first = _ids(out) + _ids(failures)
    assert 1 <= len(first) < n

    assert annotate(_annotate_args(critic_server, data, out)) == 0  # the same command resumes
    done, failed = _ids(out), _ids(failures)
    assert sorted(done + failed) == sorted(json.loads(line)["id"] for line in data.read_text().splitlines())
    assert set(first) <= set(done + failed)  # nothing of the killed run was redone or lost
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["structured_output"] == "json_schema"
    assert report["skipped_done"] + report["skipped_failed"] == len(first)
    assert report["done"] + report["failed"] == n - len(first) and report["complete"]
    assert (report["output_records"], report["failure_records"]) == (len(done), len(failed))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record in records:
        assert all(span in record["response"] for span in record["good_spans"] + record["poor_spans"])
    # the server held every answer to the schema: JSON from the first character, reasoning first (a free-form
    # answer from this model starts with prose); a long one is cut by max_tokens, then it is repaired or fails
    raws = [r["meta"]["_annotation"]["raw"] for r in records] + [
        json.loads(line)["raw"] for line in failures.read_text().splitlines()]
    assert raws and all(raw.lstrip().startswith('{') and '"reasoning"' in raw[:40] for raw in raws), raws


def test_the_pairwise_judge_in_both_orders(critic_server):
    items = [PairwiseItem(f"item-{k}", f"Summarize: {p.split(': ', 1)[1]}", r, "No idea.")
             for k, (p, r) in enumerate(zip(PROMPTS[:2], RESPONSES[:2]))]
    cfg = JudgeConfig(model=critic_server.model, base_url=critic_server.base_url, max_tokens=32, concurrency=4,
                      max_retries=1, timeout_s=1200)
    judgments = judge_pairwise(items, cfg, load_prompt("summarization_pairwise"), progress_bar=False, swap=True)
    assert [(j.id, j.candidate_position) for j in judgments] == [(i.id, pos) for i in items for pos in ("A", "B")]
    assert all(j.error is None and j.judge_output for j in judgments)  # every request answered
    summary = win_rate_summary(judgments)
    assert summary["n_items"] == 4 and summary["failed"] == 0
    assert summary["n_valid"] + summary["unparseable"] == 4
    if summary["n_valid"]:
        assert 0.0 <= summary["win_rate"] <= 1.0
