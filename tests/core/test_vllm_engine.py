"""The vLLM engine (`text2grad.core.vllm_engine`) on the real SmolLM2-135M-Instruct, against transformers.

The engine tests are slow (the engine starts once per test session, ~30-80 s on 2 CPU cores; it is shared with
the PPO and reward-model vLLM tests through `shared_engine`). The prompt-id tests need no engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.vllm_testlib import engine_for_tests, engine_options, make_smollm2_lora_adapter
from text2grad.core.assets import real_tokenizer, smollm2_path
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.modeling import load_causal_lm
from text2grad.core.vllm_engine import (
    CPU_WORKER_SPIN_SECONDS, EngineWeights, lora_rank_slot, resolve_lora_mode, shared_engine, vllm_available,
)

ROOT = Path(__file__).resolve().parents[2]

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "Why is the sky blue?",
]


def test_prompt_ids_hold_one_bos_for_templated_and_plain_text():
    tok = real_tokenizer("llama3")
    bos = tok.bos_token_id
    templated = apply_chat_template(tok, "Hello there")
    assert templated.startswith(tok.bos_token)
    plain_ids, templated_ids = encode_prompt_ids(tok, ["Hello there", templated])  # the rule decides per prompt
    assert plain_ids[0] == bos and plain_ids.count(bos) == 1
    assert templated_ids[0] == bos and templated_ids.count(bos) == 1
    # the trainer passes False for templated prompts: still one BOS
    assert encode_prompt_ids(tok, [templated], add_special_tokens=False)[0] == templated_ids


def test_prompt_ids_are_cut_from_the_left_keeping_bos():
    tok = real_tokenizer("llama3")
    long = " ".join(f"word{i}" for i in range(100)) + " the question?"
    full = encode_prompt_ids(tok, [long])[0]
    cut = encode_prompt_ids(tok, [long], max_prompt_length=10)[0]
    assert len(cut) == 10 and cut == [tok.bos_token_id] + full[-9:]  # the end kept, BOS still first


def test_lora_rank_slots():
    assert [lora_rank_slot(r) for r in (1, 8, 16, 17, 64)] == [16, 16, 16, 32, 64]
    with pytest.raises(ValueError, match="largest supported rank"):
        lora_rank_slot(1000)


def test_lora_mode_auto_merges_on_a_cpu_and_serves_lora_requests_on_a_gpu():
    assert resolve_lora_mode("auto", on_gpu=False) == "merged"
    assert resolve_lora_mode("auto", on_gpu=True) == "adapter"
    assert resolve_lora_mode("merged", on_gpu=True) == "merged" and resolve_lora_mode("adapter", on_gpu=False) == "adapter"
    with pytest.raises(ValueError, match="lora_mode must be one of auto, merged, adapter, got 'lora'"):
        resolve_lora_mode("lora")


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return tokenizer, model


@pytest.mark.slow
def test_greedy_vllm_equals_greedy_transformers_token_for_token(smollm2):
    engine = engine_for_tests()
    tokenizer, model = smollm2
    prompts = [apply_chat_template(tokenizer, q) for q in QUESTIONS]
    hf = generate(model, tokenizer, prompts, max_new_tokens=24, add_special_tokens=False)
    ids = encode_prompt_ids(tokenizer, prompts, add_special_tokens=False)
    vl = engine.generate(tokenizer, ids, max_new_tokens=24)
    for h, v in zip(hf, vl):
        assert v.prompt_ids == h.prompt_ids  # the engine conditioned on exactly our ids (nothing added)
        assert v.response_ids == h.response_ids, (h.text, v.text)
        assert (v.text, v.finished) == (h.text, h.finished)


@pytest.mark.slow
def test_sampled_logprobs_match_the_model_at_the_sampling_temperature(smollm2):
    engine = engine_for_tests()
    tokenizer, model = smollm2
    prompts = [apply_chat_template(tokenizer, q) for q in QUESTIONS[:2]]
    ids = encode_prompt_ids(tokenizer, prompts, add_special_tokens=False)
    rows = engine.generate(tokenizer, ids, max_new_tokens=12, do_sample=True, temperature=0.7, logprobs=True, seed=3)
    again = engine.generate(tokenizer, ids, max_new_tokens=12, do_sample=True, temperature=0.7, logprobs=True, seed=3)
    assert [r.response_ids for r in rows] == [r.response_ids for r in again]  # seeded: reproducible
    for row in rows:
        full = torch.tensor([row.prompt_ids + row.response_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(row.prompt_ids) - 1 : -1].float() / 0.7
        ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(row.response_ids)[:, None])[:, 0]
        assert len(row.sampled_logprobs) == len(row.response_ids)
        assert torch.allclose(torch.tensor(row.sampled_logprobs), ours, atol=2e-3), (row.sampled_logprobs, ours)


@pytest.mark.slow
def test_the_cpu_engines_worker_spins_briefly_after_a_request():
    # vLLM's worker busy-waits 1 s for its next message; on a CPU the engine shortens that (its core is the training
    # steps' between requests). The queue readers must still be where the engine looks for them.
    engine = engine_for_tests()
    assert engine.set_worker_spin(CPU_WORKER_SPIN_SECONDS) >= 1


@pytest.mark.slow
def test_a_second_engine_with_other_settings_is_refused_with_the_difference():
    engine = engine_for_tests()
    assert engine_for_tests() is engine  # same settings: the running engine
    with pytest.raises(ValueError, match=r"dtype 'bfloat16' \(running: 'float32'\)"):
        shared_engine(smollm2_path(), dtype="bf16", max_lora_rank=64)
    # on a CPU the shared engine merges adapters; one serving LoRA requests is another engine
    with pytest.raises(ValueError, match=r"lora_mode 'adapter' \(running: 'merged'\)"):
        shared_engine(smollm2_path(), dtype="fp32", max_lora_rank=16, lora_mode="adapter", **engine_options())


@pytest.mark.slow
def test_a_merged_adapter_writes_what_transformers_writes_with_the_merged_model(smollm2, tmp_path):
    engine = engine_for_tests()
    assert not engine.serves_lora_requests  # a CPU: adapters are merged (lora_mode auto)
    tokenizer, model = smollm2
    prompts = [apply_chat_template(tokenizer, q) for q in QUESTIONS]
    ids = encode_prompt_ids(tokenizer, prompts, add_special_tokens=False)
    adapter = make_smollm2_lora_adapter(tmp_path / "adapter", seed=2)
    weights = engine.adapter(adapter, name="test-adapter")
    assert isinstance(weights, EngineWeights)
    merged = load_causal_lm(str(smollm2_path()), adapter=str(adapter), dtype="fp32", merge_adapter=True).eval()

    swaps = engine.weight_swaps
    with_adapter = engine.generate(tokenizer, ids, max_new_tokens=16, weights=weights)
    assert engine.weight_swaps == swaps + 1
    assert [r.response_ids for r in with_adapter] == [
        r.response_ids for r in generate(merged, tokenizer, prompts, max_new_tokens=16, add_special_tokens=False)
    ]
    engine.generate(tokenizer, ids[:1], max_new_tokens=2, weights=weights)
    assert engine.weight_swaps == swaps + 1  # already held: no second load
    # no weights: the engine loads its own back and writes what the base model writes
    base = engine.generate(tokenizer, ids, max_new_tokens=16)
    assert engine.weight_swaps == swaps + 2
    assert [r.response_ids for r in base] == [
        r.response_ids for r in generate(model, tokenizer, prompts, max_new_tokens=16, add_special_tokens=False)
    ]
    assert [r.response_ids for r in base] != [r.response_ids for r in with_adapter]


@pytest.mark.slow
def test_weights_replaced_under_the_same_name_are_refused(smollm2):
    engine = engine_for_tests()
    tokenizer, model = smollm2
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    first = engine.weights(state, name="policy-test")
    second = engine.weights(state, name="policy-test")
    assert first.folder != second.folder and not first.folder.exists()
    ids = encode_prompt_ids(tokenizer, [apply_chat_template(tokenizer, QUESTIONS[0])], add_special_tokens=False)
    with pytest.raises(ValueError, match="replaced by a later call"):
        engine.generate(tokenizer, ids, max_new_tokens=2, weights=first)
    assert engine.generate(tokenizer, ids, max_new_tokens=2, weights=second)[0].response_ids


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, waiting for its new parent to reap it
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, seconds: float) -> list[int]:
    """The pids still alive after waiting up to ``seconds`` for all of them to end."""
    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


# An owner process: starts ``sleep`` (standing in for the engine core) and a reaper for it, prints the pid, then is
# killed by SIGKILL (no cleanup runs), after releasing the reaper when asked to.
OWNER = """
import os, signal, subprocess, sys
from text2grad.core.vllm_engine import EngineReaper
before = EngineReaper.descendants()
child = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
reaper = EngineReaper.start(EngineReaper.descendants() - before)
assert reaper.pids == (child.pid,), reaper.pids
if sys.argv[1] == "release":
    reaper.release()
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("release", [False, True], ids=["owner-killed", "released-then-killed"])
def test_a_reaper_ends_the_engine_processes_of_an_owner_that_dies_without_closing_them(release):
    owner = subprocess.run([sys.executable, "-c", OWNER, "release" if release else "keep"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert owner.returncode == -9, owner.stderr
    child = int(owner.stdout.split()[-1])
    try:
        if release:  # closed engines are left alone: the reaper has gone without a signal
            assert _wait_gone([child], 3.0) == [child]
        else:
            assert _wait_gone([child], 30.0) == [], "the reaper did not end the dead owner's process"
    finally:
        if not _gone(child):
            os.kill(child, 9)


# A process that starts a real engine and is killed by SIGKILL: vLLM's engine core would outlive it.
ENGINE_OWNER = """
import os, signal
from text2grad.core.assets import smollm2_path
from text2grad.core.vllm_engine import EngineReaper, VLLMEngine
if __name__ == "__main__":
    # a small share of a GPU, where there is one: the engine the other vLLM tests share may hold the rest
    engine = VLLMEngine(smollm2_path(), dtype="fp32", cpu_kv_cache_gb=0.5, gpu_memory_utilization=0.2)
    # every process the engine started (read here, not from the reaper), the reaper itself left out
    print("engine pids:", *(EngineReaper.descendants() - {engine._reaper.process.pid}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_killed_process_leaves_no_vllm_engine_behind(tmp_path):
    if not vllm_available():
        pytest.skip("vllm is not importable in this environment (install the 'vllm' extra: see env.sh)")
    script = tmp_path / "owner.py"
    script.write_text(ENGINE_OWNER)
    owner = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert owner.returncode == -9, owner.stderr[-3000:]
    line = next(line for line in owner.stdout.splitlines() if line.startswith("engine pids:"))
    pids = [int(p) for p in line.split(":")[1].split()]
    assert pids, "the engine started no process of its own"
    alive = _wait_gone(pids, 60.0)
    for pid in alive:  # leave nothing running whatever the verdict
        os.kill(pid, 9)
    assert alive == [], f"engine processes {alive} outlived the process that started them"
