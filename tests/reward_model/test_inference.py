"""Batched inference: parsed feedback in order, turned into token rewards on a policy's ids, failures counted."""

from __future__ import annotations

import sys

import pytest

from tests.reward_model.rm_testlib import INSTRUCTION, RECORDS
from reward_model.inference import GenerativeRewardModel, cut_at_json, json_complete
from text2grad.core.critics import FeedbackSource
from text2grad.core.feedback import Feedback
from text2grad.core.generation import generate
from text2grad.core.modeling import build_tiny_llama
from text2grad.core.rewards import compute_score_rewards
from text2grad.core.spans import decode_with_offsets, feedback_token_labels

PROMPTS = [r["prompt"] for r in RECORDS]
RESPONSES = [r["response"] for r in RECORDS]
REFERENCES = [Feedback.from_dict(r) for r in RECORDS]


@pytest.fixture(scope="module")
def memorized(memorized_rm):
    return GenerativeRewardModel.from_pretrained(str(memorized_rm), max_new_tokens=64, batch_size=3)


def test_memorized_model_reproduces_every_target_in_order(memorized):
    # Permuted and repeated, with batch_size=3, so rows cross batch boundaries and length sorting.
    order = [2, 0, 3, 1, 1, 2]
    memorized.reset_stats()
    feedback = memorized.generate_feedback([PROMPTS[i] for i in order], [RESPONSES[i] for i in order])
    assert len(feedback) == len(order)
    for i, fb in zip(order, feedback):
        ref = REFERENCES[i]
        assert fb.ok, fb.error
        assert (fb.critique, fb.good_spans, fb.poor_spans) == (ref.critique, ref.good_spans, ref.poor_spans)
    assert memorized.stats.requests == 6 and memorized.stats.malformed == 0 and memorized.stats.truncated == 0
    assert memorized.instruction == INSTRUCTION  # read back from text2grad_config.yaml
    assert isinstance(memorized, FeedbackSource)


@pytest.mark.parametrize("policy_tokenizer", ["unigram_tokenizer", "bpe_tokenizer"])
def test_feedback_becomes_token_rewards_on_the_policys_sampled_ids(memorized, policy_tokenizer, request):
    """The reward model's feedback, through the trainer's reward step (`compute_score_rewards`), lands on the
    exact ids another tokenizer's policy sampled (with an EOS at the end), signs as annotated."""
    tok = request.getfixturevalue(policy_tokenizer)
    sampled = [tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for text in RESPONSES]
    decoded = [decode_with_offsets(tok, ids) for ids in sampled]
    feedback = memorized.feedback(PROMPTS, [text for text, _ in decoded])
    out = compute_score_rewards(feedback, sampled, tok, mode="nl_gradient")
    for b, (sample, ids, ref, (text, offsets)) in enumerate(zip(out.samples, sampled, REFERENCES, decoded)):
        aligned = feedback_token_labels(ref, text, offsets)  # the annotated feedback on the decoded ids
        expected = aligned.labels
        assert sample.status == "ok" and sample.n_unmatched == aligned.alignment.n_unmatched
        assert sample.labels == expected and expected[-1] == 0  # EOS gets no reward
        assert out.rewards[b, : len(ids)].tolist() == [float(x) for x in expected]
    assert 1 in out.samples[2].labels and -1 not in out.samples[2].labels
    assert -1 in out.samples[3].labels and 1 not in out.samples[3].labels


def test_malformed_generations_give_zero_reward_and_are_counted(rm_world, rm_tokenizer):
    """An untrained model writes garbage: every pair gets an empty feedback, a zero reward, and no exception."""
    model = build_tiny_llama(rm_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    rm = GenerativeRewardModel(model, rm_tokenizer, instruction=INSTRUCTION, max_new_tokens=8, batch_size=2)
    feedback = rm.feedback(PROMPTS, RESPONSES)
    assert len(feedback) == 4 and all(not fb.ok and fb.raw is not None for fb in feedback)
    ids = [rm_tokenizer(text, add_special_tokens=False)["input_ids"] for text in RESPONSES]
    out = compute_score_rewards(feedback, ids, rm_tokenizer, mode="nl_gradient")
    assert [s.status for s in out.samples] == ["feedback_error"] * 4 and float(out.rewards.abs().sum()) == 0.0
    assert rm.stats.requests == 4 and rm.stats.malformed == 4 and rm.stats.truncated == 4
    assert rm.stats.malformed_rate == 1.0
    # a pair that cannot even be rendered is a counted failure too, not an exception
    out = rm.feedback(["ok prompt", "p"], ["ok response", None])  # type: ignore[list-item]
    assert "bad input" in out[1].error and rm.stats.bad_inputs == 1
    old = rm.reset_stats()
    assert old.requests == 6 and rm.stats.requests == 0
    with pytest.raises(ValueError, match="one prompt per response"):
        rm.feedback(["a"], ["b", "c"])


def test_max_new_tokens_bounds_generation(memorized):
    short = GenerativeRewardModel(memorized.model, memorized.tokenizer, instruction=INSTRUCTION, max_new_tokens=5)
    fb = short.feedback(PROMPTS[:1], RESPONSES[:1])[0]
    assert len(memorized.tokenizer(fb.raw, add_special_tokens=False)["input_ids"]) <= 6
    assert short.stats.truncated == 1 and short.stats.malformed == 1


def test_json_complete():
    assert json_complete('Fine.\n{"good_spans": ["a"], "poor_spans": []}')
    assert json_complete('{"good_spans": [], "poor_spans": []}  \n')
    assert not json_complete('Fine.\n{"good_spans": ["a"], "poor_spans": [')
    assert not json_complete('Fine.\n{"good_spans": ["a }')  # a brace inside a quote is not the end
    assert not json_complete("The { is never closed.")
    assert not json_complete('{"unrelated": 1}')


def test_generate_stop_fn_cuts_rows_at_the_first_accepting_prefix(rm_tokenizer):
    """Core change used by the reward model: text2grad.core.generation.generate(stop_fn=...)."""
    model = build_tiny_llama(rm_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    prompts = ["Summarize: Alex moved", "How do I find a bike"]
    free = generate(model, rm_tokenizer, prompts, max_new_tokens=12)
    stop = lambda text: len(text) >= 6  # noqa: E731
    cut = generate(model, rm_tokenizer, prompts, max_new_tokens=12, stop_fn=stop)
    for f, c in zip(free, cut):
        if not stop(f.text):
            assert c.response_ids == f.response_ids and not c.finished
            continue
        k = next(k for k in range(1, len(f.response_ids) + 1)
                 if stop(rm_tokenizer.decode(f.response_ids[:k], skip_special_tokens=True)))
        assert c.response_ids == f.response_ids[:k] and c.finished and stop(c.text)
    assert any(stop(f.text) for f in free)


def test_cut_at_json_stops_where_the_hf_stop_criterion_would():
    obj = '{"good_spans": ["a } b"], "poor_spans": []}'
    assert cut_at_json(f"Fine.\n{obj}\nmore text {{}}") == f"Fine.\n{obj}"  # the quoted } is not the end
    assert cut_at_json(f"Fine.\n{obj}") == f"Fine.\n{obj}"
    assert cut_at_json('Fine.\n{"good_spans": ["a"], "poor_spans": [') is None


def test_vllm_backend_is_lazy_and_explains_itself(memorized_rm, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # "not installed"
    with pytest.raises(ImportError, match="pip install 'text2grad\\[vllm\\]'"):
        GenerativeRewardModel.from_pretrained(str(memorized_rm), backend="vllm")


def test_grounded_spans_keep_grounded_outputs_and_ground_the_rest(memorized_rm, memorized):
    grounded = GenerativeRewardModel.from_pretrained(str(memorized_rm), max_new_tokens=64, batch_size=3, grounded_spans=True)
    # 1. Outputs that already quote the response are left exactly as they were.
    for fb, ref in zip(grounded.feedback(PROMPTS, RESPONSES), REFERENCES):
        assert (fb.critique, fb.good_spans, fb.poor_spans) == (ref.critique, ref.good_spans, ref.poor_spans)
    # 2. Responses edited so that the memorized quotes are no longer in them ("Oslo" -> "Rome", ...).
    edited = [r.replace("Oslo", "Rome").replace("a - b", "a * b").replace("compare", "check").replace("a cat", "one cat")
              for r in RESPONSES]
    free = memorized.feedback(PROMPTS, edited)
    assert any(s not in resp for fb, resp in zip(free, edited) for s in fb.good_spans + fb.poor_spans)
    constrained = grounded.feedback(PROMPTS, edited)
    assert all(fb.ok for fb in constrained), [(fb.raw, fb.error) for fb in constrained if not fb.ok]
    assert all(s and s in resp for fb, resp in zip(constrained, edited) for s in fb.good_spans + fb.poor_spans), [(fb.raw, resp) for fb, resp in zip(constrained, edited)]
    assert any(fb.good_spans + fb.poor_spans for fb in constrained)  # it still quotes, only from the response

