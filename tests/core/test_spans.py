"""Span alignment: quotes -> character intervals -> token labels, on two tokenizer families."""

import copy
import re
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from text2grad.core.feedback import Feedback
from text2grad.core.spans import (
    CharSpan,
    char_labels,
    decode_with_offsets,
    feedback_token_labels,
    interval_token_labels,
    locate_spans,
    normalize_with_map,
    sequence_token_labels,
    token_labels,
    token_offsets,
)

RESPONSE = "The author wrote a 200 page unpublished novel and is looking for a good editor."


def test_exact_match_offsets():
    a = locate_spans(RESPONSE, ["200 page unpublished novel"], ["a good editor"])
    assert [(s.start, s.end, s.label) for s in a.spans] == [(19, 45, 1), (65, 78, -1)]
    assert RESPONSE[19:45] == "200 page unpublished novel"
    assert a.unmatched == [] and a.n_quotes == 2


def test_normalized_match_maps_back_to_original_offsets():
    response = "She said \u201cno way\u201d  and\nleft \u2014 FAST."
    a = locate_spans(response, ['said "no way" and left - fast'], [])
    (span,) = a.spans
    assert span.normalized
    assert response[span.start : span.end] == "said \u201cno way\u201d  and\nleft \u2014 FAST"


def test_composed_and_decomposed_accents_match_and_keep_the_combining_marks():
    response = "Le cafe\u0301 e\u0301tait ferme\u0301."  # decomposed: e + COMBINING ACUTE ACCENT
    (span,) = locate_spans(response, ["caf\u00e9 \u00e9tait"], []).spans
    assert span.normalized
    assert response[span.start : span.end] == "cafe\u0301 e\u0301tait"  # ends after the accent, not before it
    (back,) = locate_spans("Le caf\u00e9 \u00e9tait.", ["cafe\u0301"], []).spans  # and the other way round
    assert (back.start, back.end) == (3, 7)


def test_zero_width_and_soft_hyphen_characters_are_invisible_to_matching():
    response = "an ex\u00adtra\u200bordinary re\u200dsult"
    (span,) = locate_spans(response, ["extraordinary result"], []).spans
    assert response[span.start : span.end] == response[3:]


_ACCENTED = st.text(alphabet="abcé\u00c9 \n\tXY-", min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(_ACCENTED, st.integers(0, 39), st.integers(1, 15), st.sampled_from(["NFC", "NFD"]), st.booleans())
def test_a_reformatted_substring_is_found_where_it_came_from(text, start, length, form, upper):
    response = unicodedata.normalize("NFD", text)  # decomposed response, quote in another form/case/spacing
    piece = response[start : start + length]
    if not piece.strip() or unicodedata.combining(piece[0]) or (start + length < len(response) and unicodedata.combining(response[start + length])):
        return  # a piece that cuts an accent off its letter is not a quote of the response
    quote = re.sub(r"\s+", "  ", unicodedata.normalize(form, piece))
    quote = quote.upper() if upper else quote
    a = locate_spans(response, [quote])
    assert a.unmatched == []
    target = normalize_with_map(piece)[0]
    assert any(normalize_with_map(response[s.start : s.end])[0] == target for s in a.spans)
    # its own place is among the hits, unless an overlapping earlier occurrence of the same text took it
    own = (start + len(piece) - len(piece.lstrip()), start + len(piece.rstrip()))
    assert any((s.start, s.end) == own for s in a.spans) or len(a.spans) > 1 or a.spans[0].start < own[0]


def test_surrounding_whitespace_in_quote_is_ignored():
    a = locate_spans(RESPONSE, ["  good editor \n"], [])
    assert RESPONSE[a.spans[0].start : a.spans[0].end] == "good editor"
    assert not a.spans[0].normalized


def test_unmatched_spans_are_returned_not_dropped():
    a = locate_spans(RESPONSE, ["first time author", "novel"], ["", "editorial"])
    assert [q for q, _ in a.unmatched] == ["first time author", "", "editorial"]
    assert [lab for _, lab in a.unmatched] == [1, -1, -1]
    assert a.n_unmatched == 3 and a.n_quotes == 4


def test_repeated_quote_policy():
    text = "good day, good night"
    assert [(s.start, s.end) for s in locate_spans(text, ["good"]).spans] == [(0, 4), (10, 14)]
    assert [(s.start, s.end) for s in locate_spans(text, ["good"], occurrence="first").spans] == [(0, 4)]
    with pytest.raises(ValueError):
        locate_spans(text, ["good"], occurrence="last")  # type: ignore[arg-type]


def test_overlap_precedence():
    spans = [CharSpan(0, 6, 1, "x"), CharSpan(4, 8, -1, "y")]
    assert char_labels(10, spans).tolist() == [1, 1, 1, 1, -1, -1, -1, -1, 0, 0]
    assert char_labels(10, spans, overlap="good").tolist() == [1, 1, 1, 1, 1, 1, -1, -1, 0, 0]


def test_token_labels_boundary_rules_by_hand():
    text = "ab cd ef"
    #        tokens: "ab", " cd", " e", "f"  (leading-space tokens as byte-level BPE makes them)
    offsets = [(0, 2), (2, 5), (5, 7), (7, 8)]
    labels = np.zeros(len(text), dtype=np.int8)
    labels[3:5] = 1  # "cd"
    labels[7] = -1  # "f"
    assert token_labels(text, offsets, labels) == [0, 1, 0, -1]  # the space does not count against " cd"
    labels2 = np.zeros(len(text), dtype=np.int8)
    labels2[4:8] = 1  # "d ef": straddles token " cd" (half) and covers " e", "f"
    assert token_labels(text, offsets, labels2, boundary="any") == [0, 1, 1, 1]
    assert token_labels(text, offsets, labels2, boundary="majority") == [0, 0, 1, 1]  # " cd": 1 of 2 visible chars
    assert token_labels(text, offsets, labels2, boundary="all") == [0, 0, 1, 1]
    mixed = np.array([1, -1, 0, 0, 0, 0, 0, 0], dtype=np.int8)
    assert token_labels(text, offsets, mixed)[0] == -1
    assert token_labels(text, offsets, mixed, overlap="good")[0] == 1
    assert token_labels(text, [(2, 2), (2, 3)], labels) == [0, 0]  # empty and whitespace-only tokens


def _check_alignment(tokenizer, text, ids, offsets, quote, label):
    result = feedback_token_labels(
        Feedback(good_spans=(quote,) if label > 0 else (), poor_spans=(quote,) if label < 0 else ()), text, offsets
    )
    (span,) = result.alignment.spans
    for tok_label, (s, e) in zip(result.labels, offsets):
        overlaps = any(not text[i].isspace() and span.start <= i < span.end for i in range(s, e))
        assert (tok_label == label) == overlaps, (tokenizer.convert_ids_to_tokens(ids), offsets, result.labels)
    # every visible character of the quote is covered by a labelled token
    covered = set()
    for tok_label, (s, e) in zip(result.labels, offsets):
        if tok_label == label:
            covered.update(range(s, e))
    assert all(i in covered for i in range(span.start, span.end) if not text[i].isspace())


QUOTES = [("first-time author", 1), ("said \u201chello\u201d", -1), ("Stra\u00dfe, \u6771\u4eac", 1), ("\U0001f642 and", -1)]
TEXT = "The caf\u00e9\u2019s owner \u2014 a first-time author \u2014 said \u201chello\u201d. Emoji \U0001f642 and Stra\u00dfe, \u6771\u4eac."


@pytest.mark.parametrize("quote,label", QUOTES)
def test_tokenizer_offsets_align_on_both_families(any_tokenizer, quote, label):
    ids, offsets = token_offsets(any_tokenizer, TEXT)
    _check_alignment(any_tokenizer, TEXT, ids, offsets, quote, label)


@pytest.mark.parametrize("quote,label", QUOTES)
def test_generated_ids_with_eos_align_on_both_families(any_tokenizer, quote, label):
    ids = any_tokenizer(TEXT, add_special_tokens=False)["input_ids"] + [any_tokenizer.eos_token_id]
    text, offsets = decode_with_offsets(any_tokenizer, ids)
    assert len(offsets) == len(ids) and offsets[-1][0] == offsets[-1][1]  # EOS covers no characters
    assert text == any_tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    _check_alignment(any_tokenizer, text, ids, offsets, quote, label)


def test_non_canonical_ids_take_the_slow_path(bpe_tokenizer):
    # The policy may sample a non-canonical segmentation ("goo" + "d editor"); re-tokenizing would differ.
    a = bpe_tokenizer("The goo", add_special_tokens=False)["input_ids"]
    b = bpe_tokenizer("d editor", add_special_tokens=False)["input_ids"]
    ids = a + b
    text, offsets = decode_with_offsets(bpe_tokenizer, ids)
    assert text == "The good editor"
    assert bpe_tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    pieces = [text[s:e] for s, e in offsets]
    assert "".join(pieces) == text
    labels = feedback_token_labels(Feedback(poor_spans=("editor",)), text, offsets).labels
    start = text.index("editor")
    flagged = [(s, e) for (s, e), lab in zip(offsets, labels) if lab == -1]
    assert flagged and all(e > start for s, e in flagged)  # only tokens touching "editor"
    assert "editor" in "".join(text[s:e] for s, e in flagged)


def test_byte_fragments_share_the_character(bpe_tokenizer):
    ids = bpe_tokenizer("x \U0001f642 y", add_special_tokens=False)["input_ids"]
    text, offsets = decode_with_offsets(bpe_tokenizer, ids + [bpe_tokenizer.eos_token_id])
    emoji_at = text.index("\U0001f642")
    labels = feedback_token_labels(Feedback(poor_spans=("\U0001f642",)), text, offsets).labels
    flagged = [o for o, lab in zip(offsets, labels) if lab == -1]
    assert flagged and all(s <= emoji_at < e for s, e in flagged)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60), st.integers(0, 59), st.integers(1, 20))
def test_normalized_map_points_inside_text(text, start, length):
    norm, index = normalize_with_map(text)
    assert len(norm) == len(index)
    assert all(0 <= i < len(text) for i in index)
    assert index == sorted(index)
    quote = text[start : start + length]
    if quote.strip():
        a = locate_spans(text, [quote])
        # Any substring of the response is found (exactly), at a place where that substring occurs.
        assert a.unmatched == [] and all(text[s.start : s.end] == quote.strip() for s in a.spans)



CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_response_inside_a_chat_templated_sequence(any_tokenizer):
    tok = copy.deepcopy(any_tokenizer)  # the fixture is shared by the session: template a copy
    tok.chat_template = CHAT_TEMPLATE
    prompt = [{"role": "user", "content": "Summarize the post about the novel."}]
    messages = prompt + [{"role": "assistant", "content": RESPONSE}]
    start = len(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    full_ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    end = full_ids.index(tok.eos_token_id, start)  # the template closes the turn with EOS and a newline
    fb = Feedback(good_spans=("200 page unpublished novel",), poor_spans=("good editor",))

    seq = sequence_token_labels(tok, full_ids, start, fb, response_end=end)

    # Ground truth from the rendered text's own offset mapping: a token is labelled iff it covers a visible
    # character of a quote. (Inside the template the response's ids differ from tokenizing it alone.)
    full_text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(full_text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == full_ids
    at = full_text.index(RESPONSE)
    quotes = {1: at + RESPONSE.index(fb.good_spans[0]), -1: at + RESPONSE.index(fb.poor_spans[0])}
    lengths = {1: len(fb.good_spans[0]), -1: len(fb.poor_spans[0])}
    expected = [
        next((lab for lab in (-1, 1) if any(
            quotes[lab] <= c < quotes[lab] + lengths[lab] and not full_text[c].isspace() for c in range(s, e)
        )), 0)
        for s, e in enc["offset_mapping"]
    ]
    assert seq.labels == expected and len(seq.labels) == len(full_ids)
    assert 1 in seq.labels and -1 in seq.labels
    assert seq.text == RESPONSE and seq.alignment.unmatched == []
    with pytest.raises(ValueError, match="response tokens"):
        sequence_token_labels(tok, full_ids, len(full_ids) + 1, fb)


def test_interval_token_labels_label_exactly_the_given_intervals():
    text = "Oslo is far. Oslo is cold."
    words = [(0, 4), (5, 7), (8, 12), (13, 17), (18, 20), (21, 26)]
    second = CharSpan(13, 17, -1, "Oslo")
    result = interval_token_labels([second, CharSpan(8, 11, 1, "far")], text, words)
    assert result.labels == [0, 0, 1, -1, 0, 0]  # the first Oslo stays neutral; "far." is good by any overlap
    assert result.alignment.spans[0] == second and result.alignment.unmatched == []
    by_quote = feedback_token_labels(Feedback("c", ("far",), ("Oslo",)), text, words)
    assert by_quote.labels == [-1, 0, 1, -1, 0, 0]
