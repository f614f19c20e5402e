"""Reward modes on hand-built batches: which token gets what, per sample, and what is counted."""

from __future__ import annotations

import pytest
import torch

from text2grad.core.rewards import compute_score_rewards, response_mask, span_sequence_score
from text2grad.core.feedback import Feedback


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture
def batch(bpe_tokenizer):
    """Two responses built piece by piece so we know which ids each quote covers.

    row 0: "Alex moved to" + " Berlin" + " today." + EOS       (poor: "Berlin")
    row 1: "The author" + " wrote a novel" + EOS                (good: "wrote a novel"), shorter
    """
    tok = bpe_tokenizer
    a0, b0, c0 = enc(tok, "Alex moved to"), enc(tok, " Berlin"), enc(tok, " today.")
    a1, b1 = enc(tok, "The author"), enc(tok, " wrote a novel")
    eos = tok.eos_token_id
    ids = [a0 + b0 + c0 + [eos], a1 + b1 + [eos]]
    spans = [(len(a0), len(a0) + len(b0)), (len(a1), len(a1) + len(b1))]
    feedbacks = [
        Feedback(critique="wrong city", poor_spans=("Berlin",)),
        Feedback(critique="good", good_spans=("wrote a novel",)),
    ]
    return tok, ids, spans, feedbacks


def expected_labels(n: int, span: tuple[int, int], label: int) -> torch.Tensor:
    out = torch.zeros(n)
    out[span[0] : span[1]] = label
    return out


def test_nl_gradient_puts_span_rewards_on_the_quoted_tokens_of_each_sample(batch):
    tok, ids, spans, feedbacks = batch
    out = compute_score_rewards(feedbacks, ids, tok, mode="nl_gradient", length=20)
    assert out.rewards.shape == (2, 20) and out.mask.shape == (2, 20)
    n0, n1 = len(ids[0]), len(ids[1])
    assert torch.equal(out.rewards[0, :n0], expected_labels(n0, spans[0], -1))
    assert torch.equal(out.rewards[1, :n1], expected_labels(n1, spans[1], +1))
    # padding and EOS carry nothing; the masks are per sample (different lengths)
    assert out.rewards[0, n0 - 1] == 0 and out.rewards[1, n1 - 1] == 0
    assert torch.equal(out.mask[0], (torch.arange(20) < n0).float())
    assert torch.equal(out.mask[1], (torch.arange(20) < n1).float())
    assert float(out.rewards[:, max(n0, n1):].abs().sum()) == 0
    assert [s.status for s in out.samples] == ["ok", "ok"]


def test_labels_of_each_sample_come_from_its_own_text(batch):
    """The paper's code built every sample's mask from sample 0; here swapping the rows swaps the rewards."""
    tok, ids, spans, feedbacks = batch
    straight = compute_score_rewards(feedbacks, ids, tok, mode="nl_gradient", length=20)
    swapped = compute_score_rewards(feedbacks[::-1], ids[::-1], tok, mode="nl_gradient", length=20)
    assert torch.equal(straight.rewards, swapped.rewards.flip(0))
    assert not torch.equal(straight.rewards[0], straight.rewards[1])
    # Sample 1's span positions differ from sample 0's: labelled positions are not shared.
    assert set(torch.nonzero(straight.rewards[0]).flatten().tolist()) != set(torch.nonzero(straight.rewards[1]).flatten().tolist())


def test_scalar_mode_puts_one_normalized_score_at_the_last_token(batch):
    tok, ids, _, _ = batch
    feedbacks = [
        Feedback(good_spans=("Alex",), poor_spans=("Berlin", "today")),  # (1 - 2) / 3
        Feedback(good_spans=("novel",)),  # (1 - 0) / 1
    ]
    out = compute_score_rewards(feedbacks, ids, tok, mode="scalar", length=20, scalar_coef=2.0)
    n0, n1 = len(ids[0]), len(ids[1])
    expected = torch.zeros(2, 20)
    expected[0, n0 - 1] = 2.0 * (-1 / 3)
    expected[1, n1 - 1] = 2.0 * 1.0
    assert torch.allclose(out.rewards, expected)
    assert all(s.labels == [] and s.n_quotes == 0 for s in out.samples)  # no span alignment in scalar mode
    assert span_sequence_score(Feedback()) == 0.0
    assert span_sequence_score(Feedback.failed("x")) == 0.0


def test_scalar_sum_puts_the_count_of_quoted_tokens_at_the_last_token(batch):
    """Hand-computed: row 0 has one poor quote of len(" Berlin") tokens, row 1 one good quote of
    len(" wrote a novel") tokens; scalar_sum gives -len and +len at the last token (EOS), nothing elsewhere."""
    tok, ids, spans, feedbacks = batch
    out = compute_score_rewards(feedbacks, ids, tok, mode="scalar_sum", length=20, scalar_coef=5.0)
    n0, n1 = len(ids[0]), len(ids[1])
    expected = torch.zeros(2, 20)
    expected[0, n0 - 1] = -float(spans[0][1] - spans[0][0])
    expected[1, n1 - 1] = +float(spans[1][1] - spans[1][0])
    assert torch.equal(out.rewards, expected)  # scalar_coef weighs sequence scores, not this sum
    assert [s.score for s in out.samples] == [expected[0, n0 - 1].item(), expected[1, n1 - 1].item()]
    # the alignment was done (labels kept for the logs), unlike plain scalar mode
    assert all(s.labels and s.n_quotes == 1 for s in out.samples)


@pytest.mark.parametrize("options", [
    {},
    {"scheme": "linear_decay"},
    {"span_normalize": True},
    {"occurrence": "first", "boundary": "all"},
    {"finished": [False, True], "missing_eos_penalty": 0.7},
])
def test_scalar_sum_equals_the_sum_of_the_nl_gradient_rewards_on_the_same_feedback(bpe_tokenizer, options):
    """The information-matched baseline: every response's last-token reward is exactly the total reward the method
    gives it, under every span option (and the missing-EOS penalty lands the same way)."""
    tok = bpe_tokenizer
    ids = [enc(tok, "Alex moved to Berlin today and Alex wrote a long novel") + [tok.eos_token_id],
           enc(tok, "The author wrote a novel in Paris and Paris again")]
    fbs = [Feedback(good_spans=("Alex", "a long novel"), poor_spans=("Berlin",)),
           Feedback(good_spans=("wrote a novel",), poor_spans=("Paris", "in Paris"))]
    token = compute_score_rewards(fbs, ids, tok, mode="nl_gradient", length=40, **options)
    summed = compute_score_rewards(fbs, ids, tok, mode="scalar_sum", length=40, **options)
    assert torch.allclose(summed.rewards.sum(-1), token.rewards.sum(-1))
    for b, row in enumerate(ids):
        n = len(row)
        assert float(summed.rewards[b, : n - 1].abs().sum()) == 0.0 and float(summed.rewards[b, n:].abs().sum()) == 0.0
        assert summed.samples[b].labels == token.samples[b].labels
    assert float(token.rewards[0].abs().sum()) > 0 and float(token.rewards[1].abs().sum()) > 0  # not a 0 == 0 check


def test_score_spread_mode_spreads_the_score_over_unlabelled_tokens(batch):
    tok, ids, spans, feedbacks = batch
    out = compute_score_rewards(feedbacks, ids, tok, mode="score_spread", length=20)
    for b, label in ((0, -1), (1, +1)):
        n = len(ids[b])
        s, e = spans[b]
        row = out.rewards[b, :n]
        assert torch.all(row[s:e] == label)  # span tokens keep their span reward
        others = torch.cat([row[:s], row[e:]])
        score = float(label)  # one quote: (#good - #poor) / 1
        assert torch.allclose(others, torch.full_like(others, score / (n - (e - s))))
        assert abs(float(others.sum()) - score) < 1e-6  # the unlabelled share sums to the score at any length
        assert torch.all(row != 0)  # every token carries reward


def test_mixed_mode_adds_an_outcome_score_to_span_rewards(batch):
    tok, ids, spans, feedbacks = batch
    out = compute_score_rewards(feedbacks, ids, tok, mode="mixed", length=20, scores=[0.25, -1.0], scalar_coef=1.0)
    n0, n1 = len(ids[0]), len(ids[1])
    exp0 = expected_labels(n0, spans[0], -1)
    exp0[n0 - 1] += 0.25
    exp1 = expected_labels(n1, spans[1], +1)
    exp1[n1 - 1] += -1.0
    assert torch.allclose(out.rewards[0, :n0], exp0) and torch.allclose(out.rewards[1, :n1], exp1)
    assert [s.score for s in out.samples] == [0.25, -1.0]


def test_missing_eos_penalty_hits_only_unfinished_responses(batch):
    tok, ids, spans, feedbacks = batch
    ids = [ids[0][:-1], ids[1]]  # row 0 ran out of tokens before EOS
    out = compute_score_rewards(
        feedbacks, ids, tok, mode="nl_gradient", finished=[False, True], missing_eos_penalty=1.5
    )
    n0, n1 = len(ids[0]), len(ids[1])
    exp0 = expected_labels(n0, spans[0], -1)
    exp0[n0 - 1] -= 1.5
    assert torch.allclose(out.rewards[0, :n0], exp0)
    assert torch.equal(out.rewards[1, :n1], expected_labels(n1, spans[1], +1))


def test_linear_decay_inside_a_span(bpe_tokenizer):
    tok = bpe_tokenizer
    pre, span = enc(tok, "I"), enc(tok, " wrote a novel")
    ids = pre + span
    out = compute_score_rewards([Feedback(good_spans=("wrote a novel",))], [ids], tok, mode="nl_gradient", scheme="linear_decay")
    n = len(span)
    decay = [1 - i * 0.9 / (n - 1) for i in range(n)]
    assert torch.allclose(out.rewards[0, len(pre) :], torch.tensor(decay))
    assert out.rewards[0, 0] == 0 and n >= 3


def test_failures_give_zero_span_reward_and_are_counted(bpe_tokenizer):
    tok = bpe_tokenizer
    eos = tok.eos_token_id
    ids = [
        [eos],  # empty response
        enc(tok, "The author wrote a novel") + [eos],  # failed feedback
        enc(tok, "The author wrote a novel") + [eos],  # quotes that are not in the response
        enc(tok, "The author wrote a novel") + [eos],  # ok
    ]
    feedbacks = [
        Feedback(good_spans=("anything",)),
        Feedback.failed("critic timed out"),
        Feedback(good_spans=("a poem",), poor_spans=("Berlin",)),
        Feedback(good_spans=("novel",), poor_spans=("not there",)),
    ]
    out = compute_score_rewards(feedbacks, ids, tok, mode="mixed", scores=[1.0, 0.5, None, 0.0])
    assert [s.status for s in out.samples] == ["empty", "feedback_error", "no_matched_span", "ok"]
    assert float(out.rewards[0].abs().sum()) == 0.0 and out.samples[0].score == 0.0  # empty: even its external score 1.0 is dropped
    n = len(ids[1])
    assert out.rewards[1, n - 1] == 0.5 and float(out.rewards[1, : n - 1].abs().sum()) == 0  # outcome kept, spans none
    assert float(out.rewards[2].abs().sum()) == 0  # nothing located; failed score function (None) -> 0
    stats = out.stats()
    assert stats["samples/empty"] == 1 and stats["samples/feedback_error"] == 1 and stats["samples/no_matched_span"] == 1
    assert stats["spans/quotes"] == 4 and stats["spans/unmatched"] == 3  # rows 2 and 3 went through alignment
    assert stats["tokens/nonzero_reward"] == float(((out.rewards != 0) & (out.mask > 0)).sum())
    # feedback-derived scores are 0 for empty responses and failed feedback
    derived = compute_score_rewards(feedbacks, ids, tok, mode="scalar")
    assert [s.score for s in derived.samples] == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("mode", ["nl_gradient", "scalar", "dense", "score_spread", "mixed", "scalar_sum"])
def test_empty_response_earns_no_score_in_any_mode_but_pays_the_missing_eos_penalty(bpe_tokenizer, mode):
    tok = bpe_tokenizer
    blank = enc(tok, "   ")
    assert blank and not tok.decode(blank, skip_special_tokens=True).strip()  # tokens, but no text
    ids = [[tok.eos_token_id], blank]  # stopped at once; ran out of tokens producing only blanks
    fbs = [Feedback(good_spans=("anything",)), Feedback(good_spans=("anything",))]
    out = compute_score_rewards(fbs, ids, tok, mode=mode, scores=[1.0, 1.0], finished=[True, False], missing_eos_penalty=0.5)
    assert [s.status for s in out.samples] == ["empty", "empty"]
    assert float(out.rewards[0].abs().sum()) == 0.0
    n = len(blank)
    assert out.rewards[1, n - 1] == -0.5 and float(out.rewards[1, : n - 1].abs().sum()) == 0.0
    assert out.stats()["samples/empty"] == 2


@pytest.mark.parametrize("mode", ["score_spread", "mixed"])
def test_no_matched_span_keeps_the_outcome_part_only(bpe_tokenizer, mode):
    tok = bpe_tokenizer
    ids = enc(tok, "The author wrote a novel") + [tok.eos_token_id]
    out = compute_score_rewards([Feedback(good_spans=("a poem",))], [ids], tok, mode=mode, scores=[0.6], scalar_coef=2.0)
    assert out.samples[0].status == "no_matched_span" and out.samples[0].labels and not any(out.samples[0].labels)
    n = len(ids)
    assert float(out.rewards[0].sum()) == pytest.approx(1.2)  # c * s, nothing from the spans
    if mode == "mixed":
        assert out.rewards[0, n - 1] == pytest.approx(1.2) and float(out.rewards[0, : n - 1].abs().sum()) == 0
    else:  # no token is labelled, so the score is spread over all of them
        assert torch.allclose(out.rewards[0, :n], torch.full((n,), 1.2 / n))


def test_length_alone_does_not_pay(bpe_tokenizer):
    tok = bpe_tokenizer
    fb = Feedback(good_spans=("wrote a novel",))
    short = enc(tok, "The author wrote a novel") + [tok.eos_token_id]
    long = enc(tok, "The author wrote a novel and the author kept writing for many more words") + [tok.eos_token_id]
    for mode in ("nl_gradient", "mixed", "dense", "score_spread", "scalar", "scalar_sum"):
        out = compute_score_rewards([fb, fb], [short, long], tok, mode=mode)
        totals = out.rewards.sum(-1)
        assert torch.isclose(totals[0], totals[1]), mode


def test_response_mask_and_input_checks(bpe_tokenizer):
    assert torch.equal(response_mask([2, 0, 3], 3), torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match="mode must be"):
        compute_score_rewards([Feedback()], [[5]], bpe_tokenizer, mode="sparse")
    with pytest.raises(ValueError, match="1 feedbacks for 2 responses"):
        compute_score_rewards([Feedback()], [[5], [6]], bpe_tokenizer, mode="scalar")
    with pytest.raises(ValueError, match="shorter than the longest"):
        compute_score_rewards([Feedback()], [[5, 6, 7]], bpe_tokenizer, mode="scalar", length=2)
