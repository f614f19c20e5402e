"""The dense ablation (labelled-token share on a hand-built example) and the token-importance weighting."""

from __future__ import annotations

import json

import pytest
import torch

from policy_optimization.ppo_config import PPOConfig
from text2grad.core.feedback import Feedback, parse_feedback
from text2grad.core.rewards import compute_score_rewards, labelled_token_share
from text2grad.core.spans import decode_with_offsets
from text2grad.core.token_importance import (
    importance_weights,
    locate_tagged_words,
    pattern_tagger,
    pos_importance_weights,
)


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture
def dense_example(bpe_tokenizer):
    """'Alex moved to Berlin' good | ' for a job' poor | ' and' unlabelled | ' loves the food.' good | EOS."""
    tok = bpe_tokenizer
    pieces = ["Alex moved to Berlin", " for a job", " and", " loves the food."]
    ids_per_piece = [enc(tok, p) for p in pieces]
    ids = [t for piece in ids_per_piece for t in piece] + [tok.eos_token_id]
    # the dense record format: a span_scores list of {text, label} covering the response
    record = {"span_scores": [{"text": "Alex moved to Berlin", "label": "good"}, {"text": "for a job", "label": "poor"},
                              {"text": "and", "label": "neutral"}, {"text": "loves the food.", "label": "good"}]}
    return tok, ids_per_piece, ids, record


def test_dense_feedback_labels_most_tokens_and_its_share_is_reported(dense_example):
    tok, pieces, ids, record = dense_example
    parsed = parse_feedback(json.dumps(record))
    assert parsed.ok and parsed.feedback.good_spans == ("Alex moved to Berlin", "loves the food.")
    assert parsed.feedback.poor_spans == ("for a job",)  # neutral parts carry no label
    out = compute_score_rewards([parsed.feedback], [ids], tok, mode="dense")
    # each piece's label on its tokens; a token of blanks only is never labelled (text2grad.core.spans), and
    # the EOS token has no characters
    expected = [
        label if tok.decode([t]).strip() else 0
        for piece, label in zip(pieces, (1, -1, 0, 1)) for t in piece
    ] + [0]
    assert out.samples[0].labels == expected
    share = sum(x != 0 for x in expected) / len(ids)
    assert labelled_token_share([out.samples[0].labels]) == pytest.approx(share)
    assert out.stats()["tokens/labelled_share"] == pytest.approx(share)
    assert share > 0.6
    # dense mode rewards are the span rewards themselves (no sequence score anywhere)
    assert torch.equal(out.rewards[0], torch.tensor(expected, dtype=torch.float32))
    # a CoT-style feedback with one short quote labels far fewer tokens of the same response
    sparse = compute_score_rewards([Feedback(critique="c", poor_spans=("for a job",))], [ids], tok, mode="nl_gradient")
    n_poor = sum(1 for t in pieces[1] if tok.decode([t]).strip())
    assert sparse.stats()["tokens/labelled_share"] == pytest.approx(n_poor / len(ids))
    assert n_poor / len(ids) < share / 3


def test_labelled_share_over_several_responses():
    assert labelled_token_share([[1, 0, -1, 0], [0, 0]]) == pytest.approx(2 / 6)
    assert labelled_token_share([]) == 0.0


# A sentence tagged by hand with Penn Treebank tags (what TextBlob's Pattern tagger returns for it).
SENTENCE = "Alex quickly wrote three short novels."
TAGS = [("Alex", "NNP"), ("quickly", "RB"), ("wrote", "VBD"), ("three", "CD"), ("short", "JJ"), ("novels", "NNS"), (".", ".")]


def test_importance_weights_on_a_tagged_sentence():
    words = locate_tagged_words(SENTENCE, TAGS)
    assert words[2] == (13, 18, "VBD") and words[-1] == (37, 38, ".")
    # tokens: "Alex", " quickly", " wro", "te", " three", " short", " nov", "els", ".", EOS (no characters)
    offsets = [(0, 4), (4, 12), (12, 16), (16, 18), (18, 24), (24, 30), (30, 34), (34, 37), (37, 38), (38, 38)]
    weights = importance_weights(offsets, words)
    assert weights == [1.0, 0.2, 1.0, 1.0, 0.2, 0.2, 1.0, 1.0, 0.2, 0.2]


def test_the_offline_pos_tagger_tags_the_sentence_as_expected():
    assert pattern_tagger()(SENTENCE) == TAGS


def test_pos_importance_scales_span_rewards(bpe_tokenizer):
    tok = bpe_tokenizer
    pieces = [enc(tok, "Alex"), enc(tok, " moved to"), enc(tok, " Berlin")]
    ids = [t for p in pieces for t in p] + [tok.eos_token_id]
    fb = Feedback(critique="c", poor_spans=("Alex moved to Berlin",))

    def tagger(text: str) -> list[tuple[str, str]]:  # fixed tags, so the expected weights are exact
        assert text == "Alex moved to Berlin"
        return [("Alex", "NNP"), ("moved", "VBD"), ("to", "TO"), ("Berlin", "NNP")]

    plain = compute_score_rewards([fb], [ids], tok, mode="nl_gradient")
    weighted = compute_score_rewards([fb], [ids], tok, mode="nl_gradient", weighting="pos_importance", pos_tagger=tagger)
    decoded_weights = pos_importance_weights(*_decoded(tok, ids), tagger=tagger)
    assert torch.allclose(weighted.rewards[0], plain.rewards[0] * torch.tensor(decoded_weights))
    # every token of "Alex" and "Berlin" keeps -1; the tokens of " to" alone get -0.2
    to_tokens = [i for i, (s, e) in enumerate(_decoded(tok, ids)[1]) if _decoded(tok, ids)[0][s:e].strip() == "to"]
    assert to_tokens and all(float(weighted.rewards[0, i]) == pytest.approx(-0.2) for i in to_tokens)
    assert float(weighted.rewards[0, 0]) == -1.0
    with pytest.raises(ValueError, match="weighting must be"):
        compute_score_rewards([fb], [ids], tok, mode="nl_gradient", weighting="nouns")


def _decoded(tok, ids):
    return decode_with_offsets(tok, ids)


def test_ppo_config_reaches_the_weighting():
    assert PPOConfig(reward_weighting="pos_importance").reward_weighting == "pos_importance"
    with pytest.raises(ValueError, match="reward_weighting"):
        PPOConfig(reward_weighting="nouns")
