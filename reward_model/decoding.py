"""Grounded span decoding for the generative reward model (the "hf" backend's ``grounded_spans`` option).

While the reward model writes a quote inside a ``"good_spans"``/``"poor_spans"`` list, `QuoteConstraint`
allows only tokens that keep the quote an exact substring of the response under review, so no span is lost
as unmatched; the critique and everything outside the span lists are generated freely. It plugs into the
generic ``logits_processors`` hook of `text2grad.core.generation.generate` through
`grounded_span_processors`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Sequence

import torch

__all__ = ["QuoteConstraint", "grounded_span_processors", "grounded_request_constraint", "open_quote", "span_list_state"]


def grounded_span_processors(tokenizer, sources: Sequence[str]) -> Callable[[range, int], list[Any]]:
    """The ``logits_processors`` hook for `generate`: prompt ``i`` quotes only from ``sources[i]``."""
    sources = list(sources)

    def processors(rows: range, prompt_width: int) -> list[Any]:
        return [QuoteConstraint(tokenizer, prompt_width, [sources[i] for i in rows])]

    return processors


def grounded_request_constraint(tokenizer, source: str) -> Callable[[list[int], torch.Tensor], torch.Tensor]:
    """The same constraint for one request of the vLLM engine (``text2grad.core.vllm_engine.request_constraint(
    "reward_model.decoding:grounded_request_constraint", source=response)``): called in the engine's process with
    the ids generated so far and the next token's logits (V,), it masks them as `QuoteConstraint` masks a row."""
    constraint = QuoteConstraint(tokenizer, 0, [source])

    def constrain(generated_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        return constraint(torch.tensor([generated_ids], dtype=torch.long), logits[None].clone())[0]

    return constrain



# The opening of a span list as the reward model writes it: "good_spans": [  (any case, space or underscore)
_SPAN_LIST_OPEN = re.compile(r'"(?:good|poor)[ _]?spans"\s*:\s*\[', re.IGNORECASE)


def span_list_state(text: str) -> tuple[str, str] | None:
    """Where ``text`` ends relative to the last open span list: ``("quote", q)``, ``("item", "")``,
    ``("next", "")`` or None.

    After the last ``"good_spans": [`` / ``"poor_spans": [`` opening (any case, space or underscore), if that
    list is still open: inside a quoted item (an odd number of unescaped double quotes follow) the state is
    ``("quote", q)`` with ``q`` the item's JSON-escaped text so far; right after an item it is ``("item", "")``
    (a comma or the list's end must come next); after the opening bracket or a comma it is ``("next", "")``.
    None when no span list is open.
    """
    match = None
    for match in _SPAN_LIST_OPEN.finditer(text):
        pass
    if match is None:
        return None
    in_string, escaped, start, after_item = False, False, 0, False
    for k in range(match.end(), len(text)):
        ch = text[k]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string, after_item = False, True
        elif ch == '"':
            in_string, start = True, k + 1
        elif ch == ",":
            after_item = False
        elif ch == "]":
            return None
    if in_string:
        return ("quote", text[start:])
    return ("item", "") if after_item else ("next", "")


def open_quote(text: str) -> str | None:
    """The JSON-escaped text of the span quote ``text`` ends inside, or None when it is not inside one.

    ``open_quote('..."poor_spans": ["Fel')`` is ``'Fel'``; ``open_quote('..."poor_spans": ["Felix", ')`` is
    None (between items). See `span_list_state`.
    """
    state = span_list_state(text)
    return state[1] if state is not None and state[0] == "quote" else None


# What may follow the closing quote inside the same token: the next item's opening or the list's end.
# (JSON whitespace only: \s would also let control characters through, which JSON forbids outside strings)
_AFTER_CLOSE = re.compile(r'[ \t\n\r]*(?:,[ \t\n\r]*"?)?|[ \t\n\r]*\].*', re.DOTALL)
_NEXT_ITEM = re.compile(r'[ \t\n\r]*"?|[ \t\n\r]*\].*', re.DOTALL)


class _TokenTrie:
    """The vocabulary as a character trie of each token's text, for prefix walks over a source text."""

    def __init__(self, token_texts: Sequence[str]):
        self.texts = list(token_texts)
        self.root: dict[str, Any] = {}
        for tok_id, text in enumerate(self.texts):
            if not text or "\ufffd" in text:  # empty, special or a byte fragment: never inside a quote
                continue
            node = self.root
            for ch in text:
                node = node.setdefault(ch, {})
            node.setdefault("", []).append(tok_id)  # "" holds the ids of tokens ending at this node
        self._closing: dict[int, list[int]] = {}
        # Between items only list structure may be written: after an item a comma (and the next opening quote)
        # or the list's end; after "[" or a comma an opening quote or the list's end.
        self.after_item_ids = [i for i, t in enumerate(self.texts) if t and _AFTER_CLOSE.fullmatch(t)]
        self.next_item_ids = [i for i, t in enumerate(self.texts) if t and _NEXT_ITEM.fullmatch(t)]

    def closing_ids(self, node: dict[str, Any], depth: int) -> list[int]:
        """Ids of tokens that continue from ``node`` (``depth`` characters deep) with a closing ``"``,
        followed by nothing, ``,`` (and the next item's opening quote) or ``]`` (and anything)."""
        key = id(node)
        if key not in self._closing:
            ids: list[int] = []
            stack = [node['"']] if '"' in node else []
            while stack:
                cur = stack.pop()
                for ch, child in cur.items():
                    if ch == "":
                        ids.extend(i for i in child if _AFTER_CLOSE.fullmatch(self.texts[i][depth + 1 :]))
                    else:
                        stack.append(child)
            self._closing[key] = ids
        return self._closing[key]


_TRIES: dict[int, tuple[Any, _TokenTrie]] = {}


def _token_trie(tokenizer) -> _TokenTrie:
    """One trie per tokenizer, built on first use (about a second for a 150k vocabulary)."""
    cached = _TRIES.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    # A token's text in context: decode(anchor + token) minus decode(anchor), so SentencePiece tokens keep
    # their leading space (decoding a lone "▁Felix" drops it).
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
    head = tokenizer.decode(anchor, clean_up_tokenization_spaces=False)
    texts = tokenizer.batch_decode(
        [anchor + [i] for i in range(len(tokenizer))], skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    special = set(tokenizer.all_special_ids)
    trie = _TokenTrie(["" if i in special or not t.startswith(head) else t[len(head) :] for i, t in enumerate(texts)])
    _TRIES[id(tokenizer)] = (tokenizer, trie)
    return trie


class QuoteConstraint:
    """A logits processor for grounded span decoding: quotes in the span lists are substrings of a source.

    Row ``b`` of the batch quotes from ``sources[b]`` (the response under review). Outside the span lists the
    logits are untouched (the critique is free text). Between two items only separators, an opening quote or
    the list's closing bracket are allowed, with the comma JSON needs between items. Inside one, with ``q`` the quote so far (JSON-escaped), a token is allowed if its
    text ``t`` makes ``q + t`` a substring of the escaped source, or is ``u + '"' + rest`` with ``q + u`` a
    substring that is not blank and ``rest`` empty, ``,`` (with the next item's opening quote) or ``]`` and anything
    (the token closes the quote). If no token qualifies (``q`` itself is not in the
    source, which cannot happen once the constraint has been on from the quote's first token) the row is
    left unconstrained rather than forced into nonsense. Cost per constrained step: one trie walk over the
    source from each place where ``q`` occurs. Limitation: a token that decodes to part of a UTF-8 character
    (byte-level BPE on CJK text, emoji) is never allowed inside a quote, so such characters can only be quoted
    where the vocabulary has whole-character tokens for them.
    """

    def __init__(self, tokenizer, prompt_width: int, sources: Sequence[str]):
        self.tokenizer, self.width = tokenizer, prompt_width
        self.sources = [json.dumps(s, ensure_ascii=False)[1:-1] for s in sources]
        self.trie = _token_trie(tokenizer)

    def allowed_ids(self, row: int, quote: str) -> list[int]:
        source = self.sources[row]
        if quote:
            starts, k = [], source.find(quote)
            while k >= 0:
                starts.append(k + len(quote))
                k = source.find(quote, k + 1)
        else:
            starts = list(range(len(source)))
        allowed: set[int] = set()
        for pos in starts:
            node, depth = self.trie.root, 0
            while True:
                if (quote + source[pos : pos + depth]).strip():  # a quote must hold more than whitespace
                    allowed.update(self.trie.closing_ids(node, depth))
                if depth:
                    allowed.update(node.get("", ()))
                if pos + depth >= len(source) or source[pos + depth] not in node:
                    break
                node = node[source[pos + depth]]
                depth += 1
        return sorted(allowed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(
            input_ids[:, self.width :].tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        for row, text in enumerate(texts):
            state = span_list_state(text)
            if state is None:
                continue
            if state[0] == "quote":
                allowed = self.allowed_ids(row, state[1])
            else:
                allowed = self.trie.after_item_ids if state[0] == "item" else self.trie.next_item_ids
            if not allowed:
                continue
            mask = torch.ones(scores.shape[1], dtype=torch.bool, device=scores.device)
            mask[torch.tensor(allowed, device=scores.device)] = False
            scores[row] = scores[row].masked_fill(mask, float("-inf"))
        return scores
