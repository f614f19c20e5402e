"""The reward model's ``backend="vllm"`` on the real engine: a LoRA reward model on SmolLM2-135M-Instruct asked for
critiques of a batch of pairs through vLLM writes exactly what the transformers backend writes (same token ids in,
greedy, the same cut at the end of the JSON), and the adapter is really applied. On a CPU the engine serves the
adapter merged into whole weights (lora_mode auto); tests/core/test_vllm_lora_requests.py covers LoRA requests.

Slow: it uses the engine shared by the whole pytest run (`tests/vllm_testlib.py`; alone, this file starts it).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.reward_model.grounding_testlib import SPAN_LIST_OPENING, RowConstraints, forced_span_list
from tests.vllm_testlib import engine_for_tests, engine_options, make_smollm2_lora_adapter
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.rm_refresh import RewardModelRefresh
from reward_model.inference import GenerativeRewardModel
from text2grad.core.assets import smollm2_path
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.feedback import Feedback
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.vllm_engine import request_constraint

pytestmark = pytest.mark.slow

PROMPTS = ["Summarize: the cat sat on the mat all day.", "Summarize: Oslo is the capital of Norway.",
           "Summarize: the shop opens at nine.", "Summarize: water boils at 100 degrees."]
RESPONSES = ["A cat sat on a mat.", "Oslo is Norway's capital.", "The shop opens at ten.", "Water boils at 90 degrees."]


@pytest.fixture(scope="module")
def lora_reward_model(tmp_path_factory):
    """A SmolLM2 LoRA adapter with non-zero weights (so it changes what the model writes), saved like training does."""
    return make_smollm2_lora_adapter(tmp_path_factory.mktemp("rm_adapter"), seed=0)


def test_vllm_critiques_equal_transformers_critiques(lora_reward_model):
    engine = engine_for_tests()
    defaults = PPOConfig()
    options = dict(max_new_tokens=40, dtype="fp32", tokenizer_name_or_path=str(smollm2_path()))
    # one row per batch and the adapter merged: the transformers reference computes what the engine computes (no
    # padding; on a CPU the engine serves the adapter merged), so greedy decoding cannot tip over a near-tie differently
    hf = GenerativeRewardModel.from_pretrained(str(lora_reward_model), batch_size=1, merge_adapter=True, **options)
    vl = GenerativeRewardModel.from_pretrained(
        str(lora_reward_model), backend="vllm", **options,
        vllm_kwargs=dict(gpu_memory_utilization=defaults.vllm_gpu_memory_utilization,
                         cpu_kv_cache_gb=defaults.vllm_cpu_kv_cache_gb),
    )
    assert vl.engine.engine is engine  # the pytest run's shared engine, with the reward model's merged weights
    inputs = hf._inputs(PROMPTS, RESPONSES)
    hf_out = hf._generate(inputs, RESPONSES)
    vl_out = vl._generate(vl._inputs(PROMPTS, RESPONSES), RESPONSES)
    assert [(o.text, o.finished) for o in vl_out] == [(o.text, o.finished) for o in hf_out]
    feedback = vl.feedback(PROMPTS, RESPONSES)
    assert len(feedback) == 4 and vl.stats.requests == 4

    # the adapter is applied: the base weights write something else for the same ids
    ids = [encode_prompt_ids(hf.tokenizer, [i.text], add_special_tokens=i.add_special_tokens)[0] for i in inputs]
    base = engine.generate(hf.tokenizer, ids, max_new_tokens=40)
    assert any(b.text != o.text for b, o in zip(base, vl_out)), [b.text for b in base]


def test_grounded_quotes_inside_the_engine_equal_the_transformers_constraint():
    """Grounded span decoding runs per request inside vLLM (`text2grad.core.vllm_logits`). SmolLM2 was not trained to
    write span JSON, so a test constraint forces the span list open and then hands over to the reward model's
    grounded constraint (tests/reward_model/grounding_testlib.py); the same function constrains transformers rows."""
    engine = engine_for_tests()
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_path()))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_path()), dtype=torch.float32).eval()
    sources = ["Oslo is the capital of Sweden.", "Water boils at 90 degrees.", "The shop opens at ten."]
    prompts = [apply_chat_template(tokenizer, f"Quote the wrong words in: {s}") for s in sources]
    ids = encode_prompt_ids(tokenizer, prompts, add_special_tokens=False)
    constraints = [request_constraint("tests.reward_model.grounding_testlib:forced_span_list", source=s) for s in sources]
    vl = engine.generate(tokenizer, ids, max_new_tokens=24, constraints=constraints)
    hf = generate(model, tokenizer, prompts, max_new_tokens=24, batch_size=1, add_special_tokens=False,
                  logits_processors=lambda rows, width: [RowConstraints([forced_span_list(tokenizer, sources[i]) for i in rows], width)])
    assert [v.response_ids for v in vl] == [h.response_ids for h in hf], ([v.text for v in vl], [h.text for h in hf])
    for row, source in zip(vl, sources):
        assert row.text.startswith(SPAN_LIST_OPENING)
        span_list = row.text[len(SPAN_LIST_OPENING) - 1 :].split("]", 1)[0]  # '"q1", "q2", "q3' (maybe cut short)
        quotes = span_list.split('"')[1::2]
        assert quotes[0].strip() and all(q in source for q in quotes), row.text  # grounded, even a cut-off one
    unconstrained = engine.generate(tokenizer, ids, max_new_tokens=24)  # the same engine, a request without one
    assert not any(u.text.startswith(SPAN_LIST_OPENING) for u in unconstrained)


def test_the_reward_models_grounded_spans_reach_the_engine_per_request(lora_reward_model, monkeypatch):
    engine = engine_for_tests()
    options = dict(max_new_tokens=24, dtype="fp32", tokenizer_name_or_path=str(smollm2_path()), grounded_spans=True)
    hf = GenerativeRewardModel.from_pretrained(str(lora_reward_model), batch_size=1, merge_adapter=True, **options)
    vl = GenerativeRewardModel.from_pretrained(str(lora_reward_model), backend="vllm", **options,
                                               vllm_kwargs=engine_options())
    sent = []
    real_generate = type(engine).generate
    monkeypatch.setattr(type(engine), "generate", lambda self, *a, **kw: sent.append(kw.get("constraints")) or real_generate(self, *a, **kw))
    vl_out = vl._generate(vl._inputs(PROMPTS[:2], RESPONSES[:2]), RESPONSES[:2])
    hf_out = hf._generate(hf._inputs(PROMPTS[:2], RESPONSES[:2]), RESPONSES[:2])
    assert [(o.text, o.finished) for o in vl_out] == [(o.text, o.finished) for o in hf_out]
    # one constraint per request, naming the reward model's grounded constraint and that request's response
    # (inputs go longest first, so compare as sets)
    assert len(sent) == 1 and len(sent[0]) == 2
    specs = [next(iter(c.values())) for c in sent[0]]
    assert {s["factory"] for s in specs} == {"reward_model.decoding:grounded_request_constraint"}
    assert {s["kwargs"]["source"] for s in specs} == set(RESPONSES[:2])


def _last_word_poor(prompt: str, response: str) -> Feedback:
    return Feedback(poor_spans=(response.split()[-1],))


def test_after_a_refresh_the_engine_writes_the_critiques_of_the_refreshed_adapter(lora_reward_model, tmp_path):
    """PPO's on-policy refresh of a reward model served by vLLM: it trains a transformers copy of the adapter and the
    engine then serves the trained adapter, so its critiques equal the transformers critiques of that adapter."""
    engine_for_tests()
    options = dict(max_new_tokens=32, dtype="fp32", tokenizer_name_or_path=str(smollm2_path()))
    vl = GenerativeRewardModel.from_pretrained(str(lora_reward_model), backend="vllm", vllm_kwargs=engine_options(),
                                               **options)
    inputs = vl._inputs(PROMPTS, RESPONSES)
    before = [o.text for o in vl._generate(inputs, RESPONSES)]
    refresh = RewardModelRefresh(vl, CallableFeedbackSource(_last_word_poor), every=1, samples=None, replay_paths=[],
                                 replay_ratio=0.0, steps=4, batch_size=2, learning_rate=1e-2, seed=0)
    refresh.after_iteration(1, PROMPTS, RESPONSES, [Feedback()] * len(PROMPTS),
                            SimpleNamespace(num_processes=1, is_main_process=True), tmp_path / "run")
    after = vl._generate(inputs, RESPONSES)
    assert [o.text for o in after] != before  # the engine no longer serves the adapter it started with
    hf = GenerativeRewardModel.from_pretrained(vl.engine.adapter_dir, batch_size=1, merge_adapter=True, **options)
    hf_out = hf._generate(hf._inputs(PROMPTS, RESPONSES), RESPONSES)
    assert [(o.text, o.finished) for o in after] == [(o.text, o.finished) for o in hf_out]
