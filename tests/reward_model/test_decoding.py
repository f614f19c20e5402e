"""Grounded span decoding (reward-model only): quotes in the span lists stay exact substrings of the response."""

import pytest
import torch

from reward_model.decoding import QuoteConstraint, grounded_span_processors, open_quote, span_list_state
from text2grad.core.generation import generate


@pytest.mark.parametrize(
    "text, expected",
    [
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": ["Os', "Os"),
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": ["', ""),
        ('Wrong city.\n{"good_spans": ["Alex", ', None),  # between items
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": []', None),  # list closed
        ('Wrong city.\n{"good_spans": ["Alex"], "poor', None),  # in a key, not a quote
        ('The "critique" quotes "words" freely', None),  # no span list yet
        ('{"Poor Spans": ["say \\"hi', 'say \\"hi'),  # escaped quote stays inside; other key spellings
        ('{"goodSpans": ["a]b', "a]b"),  # camelCase too; a bracket inside a quote does not close the list
        ('{"good_spans": ["a"], "note": ["b', None),  # a list under another key is not a span list
    ],
)
def test_open_quote(text, expected):
    assert open_quote(text) == expected


def _token_texts(tokenizer) -> list[str]:
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
    head = tokenizer.decode(anchor)
    special = set(tokenizer.all_special_ids)
    texts = []
    for i in range(len(tokenizer)):
        t = tokenizer.decode(anchor + [i], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        texts.append("" if i in special or "\ufffd" in t or not t.startswith(head) else t[len(head) :])
    return texts


@pytest.mark.parametrize("quote", ["", "The", "a 200 p", "novel", "looking for a good editor.", "zzz"])
def test_quote_constraint_allows_exactly_the_grounded_tokens(any_tokenizer, quote):
    source = "The author wrote a 200 page unpublished novel and is looking for a good editor."
    texts = _token_texts(any_tokenizer)
    expected = set()
    for i, t in enumerate(texts):
        if not t:
            continue
        body, closes, rest = t.partition('"')
        ws = " \t\n\r"
        if closes and not (rest.strip(ws) in ("", ",") or rest.lstrip(ws).startswith("]")
                           or (rest.lstrip(ws).startswith(",") and rest.lstrip(ws)[1:].strip(ws) == '"')):
            continue
        if (quote + body) in source and (not closes or (quote + body).strip()):
            expected.add(i)
    allowed = set(QuoteConstraint(any_tokenizer, 0, [source]).allowed_ids(0, quote))
    assert allowed == expected  # brute force over the whole vocabulary
    if quote == "zzz":
        assert not allowed  # not in the source: the caller then leaves the row unconstrained
    elif not source.endswith(quote):  # (at the very end only a '"' token could close it)
        assert allowed, "a quote that occurs in the source always has a continuation"


def test_quote_constraint_masks_only_rows_inside_a_quote(bpe_tokenizer):
    prefix = bpe_tokenizer("Summary: a", add_special_tokens=False)["input_ids"]
    inside = bpe_tokenizer('x\n{"good_spans": ["The', add_special_tokens=False)["input_ids"]
    outside = bpe_tokenizer("x\nThe critique", add_special_tokens=False)["input_ids"]
    width = len(prefix)
    pad = bpe_tokenizer.pad_token_id
    n = max(len(inside), len(outside))
    rows = [prefix + inside + [pad] * 0, prefix + outside]
    rows = [r + [pad] * (width + n - len(r)) for r in rows]
    constraint = QuoteConstraint(bpe_tokenizer, width, ["The author wrote", "The author wrote"])
    scores = torch.zeros(2, len(bpe_tokenizer))
    out = constraint(torch.tensor(rows)[:, : width + len(inside)], scores.clone())
    # row 0 ends inside a quote: only continuations of "The" found in the source stay finite
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == set(constraint.allowed_ids(0, "The"))
    assert 0 < torch.isfinite(out[0]).sum() < len(bpe_tokenizer)


def test_grounded_span_processors_give_each_batch_its_own_rows_sources(bpe_tokenizer, tiny_llama):
    sources = ["The author wrote a novel.", 'My "roommate" eats my food.', "Add a and b."]
    hook = grounded_span_processors(bpe_tokenizer, sources)
    (constraint,) = hook(range(1, 3), 7)
    assert isinstance(constraint, QuoteConstraint) and constraint.width == 7
    assert constraint.sources == ['My \\"roommate\\" eats my food.', "Add a and b."]  # JSON-escaped, rows 1 and 2
    # Through the generic hook of `generate`, over two batches: outside a span list nothing is constrained, so
    # the hook changes nothing for plain text.
    prompts = ["The author wrote", "My roommate keeps eating my food and", "def add(a, b):"]
    plain = generate(tiny_llama, bpe_tokenizer, prompts, max_new_tokens=6, batch_size=2)
    hooked = generate(tiny_llama, bpe_tokenizer, prompts, max_new_tokens=6, batch_size=2, logits_processors=hook)
    assert [g.response_ids for g in hooked] == [g.response_ids for g in plain]


def test_span_list_state_and_the_tokens_allowed_between_items(any_tokenizer):
    assert span_list_state('ok\n{"good_spans": ["a", ') == ("next", "")
    assert span_list_state('ok\n{"good_spans": [') == ("next", "")
    assert span_list_state('ok\n{"good_spans": ["a" ') == ("item", "")
    assert span_list_state('ok\n{"good_spans": ["a') == ("quote", "a")
    assert span_list_state('ok\n{"good_spans": ["a"]') is None
    constraint = QuoteConstraint(any_tokenizer, 0, ["whatever"])
    texts = _token_texts(any_tokenizer)

    def lead(t: str) -> str:  # JSON whitespace only: control characters are not allowed between items
        return t.lstrip(" \t\n\r")

    after = {i for i, t in enumerate(texts) if t and (lead(t) == "" or lead(t).startswith("]")
                                                      or (lead(t)[0] == "," and lead(lead(t)[1:]) in ("", '"')))}
    after_next = {i for i, t in enumerate(texts) if t and (lead(t) in ("", '"') or lead(t).startswith("]"))}
    assert set(constraint.trie.after_item_ids) == after and after
    assert set(constraint.trie.next_item_ids) == after_next and after_next
