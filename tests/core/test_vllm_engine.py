"""The vLLM engine (`text2grad.core.vllm_engine`) on the real SmolLM2-135M-Instruct, against transformers.

The engine tests are slow (the engine starts once per test session, ~30-80 s on 2 CPU cores; it is shared with
the PPO and reward-model vLLM tests through `shared_engine`). The prompt-id tests need no engine.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.vllm_testlib import engine_for_tests, engine_options, make_smollm2_lora_adapter
from text2grad.core.assets import real_tokenizer, smollm2_path
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.modeling import load_causal_lm
from text2grad.core.vllm_engine import (
    CPU_WORKER_SPIN_SECONDS, EngineWeights, lora_rank_slot, resolve_lora_mode, shared_engine,
)

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
