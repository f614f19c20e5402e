"""The vLLM engine (`text2grad.core.vllm_engine`) on the real SmolLM2-135M-Instruct, against transformers.

The engine tests are slow (the engine starts once per test session, ~30-80 s on 2 CPU cores; it is shared with
the PPO and reward-model vLLM tests through `shared_engine`). The prompt-id tests need no engine.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.vllm_testlib import engine_for_tests
from text2grad.core.assets import real_tokenizer, smollm2_path
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.vllm_engine import lora_rank_slot, shared_engine

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
def test_a_second_engine_with_other_settings_is_refused_with_the_difference():
    engine = engine_for_tests()
    assert engine_for_tests() is engine  # same settings: the running engine
    with pytest.raises(ValueError, match=r"dtype 'bfloat16' \(running: 'float32'\).*LoRA rank 64"):
        shared_engine(smollm2_path(), dtype="bf16", max_lora_rank=64)
