"""Batched generation shared by the reward model, the policy trainer and the evaluation scripts.

Prompts are left-padded so every row's new tokens start at the same column, the KV cache is on, and
the exact generated token ids are returned (rewards must land on the ids the model sampled, not on a
re-tokenization of the decoded text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

__all__ = ["Generation", "generate", "apply_chat_template", "QuoteConstraint", "open_quote", "span_list_state"]


@dataclass
class Generation:
    """One generated continuation.

    Attributes:
        prompt_ids: the prompt's token ids (no padding).
        response_ids: generated ids up to and including the first EOS (no padding).
        text: ``response_ids`` decoded without special tokens.
        finished: True if the model emitted EOS (or a stop string) before ``max_new_tokens``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    finished: bool


def apply_chat_template(tokenizer, prompt: str, system: str | None = None) -> str:
    """Wrap ``prompt`` in the tokenizer's chat template if it has one; otherwise return it unchanged."""
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_prompt_length: int | None = None,
    stop_strings: Sequence[str] | None = None,
    add_special_tokens: bool = True,
    generator_seed: int | None = None,
    show_progress: bool = False,
    stop_fn: Callable[[str], bool] | None = None,
    quote_sources: Sequence[str] | None = None,
) -> list[Generation]:
    """Generate one continuation per prompt, in order, in batches of ``batch_size``.

    ``max_prompt_length`` truncates prompts from the left (keeping their end, where the question is).
    ``stop_strings`` end a row once its decoded text contains one of them; the text is cut just after
    the stop string and the ids are cut to the tokens that produced it. ``stop_fn`` is the general form:
    a row stops as soon as ``stop_fn(decoded new text)`` is true (e.g. "a complete JSON object has been
    written"), and its ids are cut to the shortest prefix whose text satisfies it.
    ``quote_sources`` (one text per prompt) turns on grounded span decoding (`QuoteConstraint`): while a
    row is inside a quoted item of a ``"good_spans"``/``"poor_spans"`` list, only tokens that keep the quote
    an exact substring of that row's source text can be generated.
    """
    if quote_sources is not None and len(quote_sources) != len(prompts):
        raise ValueError(f"quote_sources needs one text per prompt: got {len(quote_sources)} for {len(prompts)} prompts")
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    device = next(model.parameters()).device
    old_side, old_trunc = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    eos_ids = _eos_ids(model, tokenizer)
    outputs: list[Generation] = []
    starts = range(0, len(prompts), batch_size)
    if show_progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="generate", unit="batch")
    try:
        for start in starts:
            batch = list(prompts[start : start + batch_size])
            enc = tokenizer(
                batch,
                return_tensors="pt",
                padding=True,
                add_special_tokens=add_special_tokens,
                truncation=max_prompt_length is not None,
                max_length=max_prompt_length,
            )
            enc = {k: v.to(device) for k, v in enc.items()}
            gen_kwargs = dict(
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos_ids,
                use_cache=True,
            )
            if do_sample:
                gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
            else:
                gen_kwargs.update(temperature=None, top_p=None, top_k=None)
            if stop_strings:
                gen_kwargs.update(stop_strings=list(stop_strings), tokenizer=tokenizer)
            width = enc["input_ids"].shape[1]
            if stop_fn is not None:
                from transformers import StoppingCriteriaList

                gen_kwargs.update(stopping_criteria=StoppingCriteriaList([_TextStop(tokenizer, width, stop_fn)]))
            if quote_sources is not None:
                from transformers import LogitsProcessorList

                sources = list(quote_sources[start : start + batch_size])
                gen_kwargs.update(logits_processor=LogitsProcessorList([QuoteConstraint(tokenizer, width, sources)]))
            sequences = model.generate(**enc, **gen_kwargs)
            for row in range(len(batch)):
                prompt_ids = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
                new = sequences[row, width:].tolist()
                outputs.append(_finish(tokenizer, prompt_ids, new, eos_ids, stop_strings, stop_fn))
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = old_side, old_trunc
    return outputs


def _eos_ids(model, tokenizer) -> list[int]:
    ids = getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class _TextStop:
    """A per-row stopping criterion: row ``b`` is done once ``stop_fn`` accepts its decoded new text."""

    def __init__(self, tokenizer, prompt_width: int, stop_fn: Callable[[str], bool]):
        self.tokenizer, self.width, self.stop_fn = tokenizer, prompt_width, stop_fn
        self.done: set[int] = set()

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        flags = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if row not in self.done:
                new = input_ids[row, self.width :].tolist()
                text = self.tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                if self.stop_fn(text):
                    self.done.add(row)
            flags[row] = row in self.done
        return flags


def _finish(tokenizer, prompt_ids, new_ids, eos_ids, stop_strings, stop_fn=None) -> Generation:
    """Cut a generated row at its first EOS (kept) and drop the padding after it."""
    response, finished = [], False
    for tok in new_ids:
        response.append(tok)
        if tok in eos_ids:
            finished = True
            break
    if not finished:  # strip trailing pad tokens that generate() appends after a stop string
        while response and response[-1] == tokenizer.pad_token_id and tokenizer.pad_token_id not in eos_ids:
            response.pop()
    text = tokenizer.decode(response, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if stop_strings and not finished:
        cut = min((text.find(s) + len(s) for s in stop_strings if s in text), default=-1)
        if cut >= 0:
            finished = True
            # keep the shortest prefix of ids whose text reaches the stop string
            for k in range(1, len(response) + 1):
                if len(tokenizer.decode(response[:k], skip_special_tokens=True, clean_up_tokenization_spaces=False)) >= cut:
                    response = response[:k]
                    break
            text = tokenizer.decode(response, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if stop_fn is not None and not finished and stop_fn(text):
        finished = True
        for k in range(1, len(response) + 1):
            if stop_fn(tokenizer.decode(response[:k], skip_special_tokens=True, clean_up_tokenization_spaces=False)):
                response = response[:k]
                break
        text = tokenizer.decode(response, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return Generation(prompt_ids, response, text, finished)


# --------------------------------------------------------------------------------------------------
# Grounded span decoding
# --------------------------------------------------------------------------------------------------

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
