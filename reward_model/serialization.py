"""How the reward model is asked, and what it learns to answer: one place for training and inference.

Input (x, y): the instruction, the task prompt x and the response y, rendered with the tokenizer's chat
template when it has one (``prompt_format="auto"``), else with `PLAIN_TEMPLATE`::

    <instruction>

    ### Prompt
    <prompt>

    ### Response
    <response>

    ### Critique

Target z = `text2grad.core.feedback.format_feedback(feedback)` followed by the EOS token: a one-line critique,
a newline, and one line of span JSON ``{"good_spans": [...], "poor_spans": [...]}``. With
``target_format="nocot"`` (the paper's no-CoT ablation) z is the span JSON alone: the model gives span
judgements with no critique before them (use `NOCOT_INSTRUCTION`, which asks for exactly that). Training puts the
loss on z only (labels are -100 on every input token and on padding); inference feeds the same input ids
and parses what the model writes with `parse_target` (the last line first, then
`text2grad.core.feedback.parse_feedback`).

Length: the response is never cut, because spans must be quotes of the whole response; when the input
is too long, the *task prompt* is shortened in the middle (its head and tail are kept, joined by
`TRUNCATION_MARK`). A training example whose target plus the prompt-less input still does not fit in
``max_length`` is dropped and counted, never silently clipped (a clipped target would teach the model
to stop mid-JSON).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from reward_model.train_config import DEFAULT_INSTRUCTION, NOCOT_INSTRUCTION, PromptFormat, TargetFormat
from text2grad.core.feedback import Feedback, ParseResult, format_feedback, parse_feedback
from text2grad.core.generation import apply_chat_template
from text2grad.core.spans import GOOD, POOR, CharSpan

__all__ = [
    "DEFAULT_INSTRUCTION",
    "PLAIN_TEMPLATE",
    "TRUNCATION_MARK",
    "IGNORE_INDEX",
    "PromptFormat",
    "RMInput",
    "EncodedExample",
    "build_rm_input",
    "fit_rm_input",
    "encode_input",
    "target_text",
    "TargetFormat",
    "NOCOT_INSTRUCTION",
    "parse_target",
    "encode_example",
    "record_feedback",
    "record_spans",
    "unambiguous_quote",
    "collate",
]

IGNORE_INDEX = -100  # label value that PyTorch's cross-entropy (and every HF causal LM) skips

PLAIN_TEMPLATE = "{instruction}\n\n### Prompt\n{prompt}\n\n### Response\n{response}\n\n### Critique\n"
# The user message when a chat template is used; the instruction goes in the user turn (not a system turn)
# because several chat templates (Gemma, Mistral) reject or drop system messages.
CHAT_USER_TEMPLATE = "{instruction}\n\n### Prompt\n{prompt}\n\n### Response\n{response}"
TRUNCATION_MARK = " [...] "


@dataclass(frozen=True)
class RMInput:
    """The rendered reward-model input and how to tokenize it.

    ``add_special_tokens`` is False for chat-template text (the template already writes BOS where the
    model wants one) and True for the plain template.
    """

    text: str
    add_special_tokens: bool


def _use_chat(tokenizer, prompt_format: PromptFormat) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise ValueError(
            "prompt_format='chat' but the tokenizer has no chat_template; use prompt_format='auto' or 'plain', "
            "or load a tokenizer that ships a chat template"
        )
    if prompt_format not in ("auto", "chat", "plain"):
        raise ValueError(f"prompt_format must be 'auto', 'chat' or 'plain', got {prompt_format!r}")
    return has_template and prompt_format != "plain"


def build_rm_input(
    tokenizer,
    prompt: str,
    response: str,
    *,
    instruction: str = DEFAULT_INSTRUCTION,
    prompt_format: PromptFormat = "auto",
) -> RMInput:
    """Render one (prompt, response) pair as the reward model's input text (see the module docstring)."""
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise TypeError(
            f"prompt and response must be strings, got {type(prompt).__name__} and {type(response).__name__}"
        )
    fields = {"instruction": instruction, "prompt": prompt, "response": response}
    if _use_chat(tokenizer, prompt_format):
        return RMInput(apply_chat_template(tokenizer, CHAT_USER_TEMPLATE.format(**fields)), add_special_tokens=False)
    return RMInput(PLAIN_TEMPLATE.format(**fields), add_special_tokens=True)


def _ids(tokenizer, rm_input: RMInput) -> list[int]:
    return list(tokenizer(rm_input.text, add_special_tokens=rm_input.add_special_tokens)["input_ids"])


def fit_rm_input(
    tokenizer,
    prompt: str,
    response: str,
    *,
    instruction: str = DEFAULT_INSTRUCTION,
    prompt_format: PromptFormat = "auto",
    max_input_length: int | None = None,
) -> RMInput:
    """`build_rm_input`, with the task prompt shortened in the middle so the input fits ``max_input_length`` tokens.

    If even an empty prompt does not fit (the response alone is too long), the full input is returned
    and the caller decides (training drops the example; inference lets the model see it all).
    """
    kw = dict(instruction=instruction, prompt_format=prompt_format)
    full = build_rm_input(tokenizer, prompt, response, **kw)
    if max_input_length is None or len(_ids(tokenizer, full)) <= max_input_length:
        return full
    overhead = len(_ids(tokenizer, build_rm_input(tokenizer, "", response, **kw)))
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    budget = max_input_length - overhead - len(tokenizer(TRUNCATION_MARK, add_special_tokens=False)["input_ids"])
    # Re-tokenizing the joined text can merge tokens differently at the cut points, so shrink until it fits.
    while budget > 0:
        head, tail = budget - budget // 2, budget // 2
        short = (
            tokenizer.decode(prompt_ids[:head], skip_special_tokens=True)
            + TRUNCATION_MARK
            + (tokenizer.decode(prompt_ids[-tail:], skip_special_tokens=True) if tail else "")
        )
        candidate = build_rm_input(tokenizer, short, response, **kw)
        n = len(_ids(tokenizer, candidate))
        if n <= max_input_length:
            return candidate
        budget -= max(1, n - max_input_length)
    return full


def encode_input(
    tokenizer,
    prompt: str,
    response: str,
    *,
    instruction: str = DEFAULT_INSTRUCTION,
    prompt_format: PromptFormat = "auto",
    max_input_length: int | None = None,
) -> list[int]:
    """Token ids of `fit_rm_input` (exactly the ids batched inference feeds the model, without padding)."""
    rm_input = fit_rm_input(
        tokenizer, prompt, response, instruction=instruction, prompt_format=prompt_format, max_input_length=max_input_length
    )
    return _ids(tokenizer, rm_input)


def target_text(feedback: Feedback, target_format: TargetFormat = "cot") -> str:
    """The text the reward model learns to write for ``feedback`` (without the EOS token).

    "cot": the critique, then the span JSON on the last line. "nocot": the span JSON only (no critique).
    """
    if target_format not in ("cot", "nocot"):
        raise ValueError(f"target_format must be 'cot' or 'nocot', got {target_format!r}")
    if target_format == "nocot":
        return format_feedback(dataclasses.replace(feedback, critique=""))
    return format_feedback(feedback)


def parse_target(text: str) -> ParseResult:
    """Parse what the reward model wrote: the inverse of `target_text`. Never raises.

    z puts the span JSON alone on its last line, so that line is tried first: a critique may contain an
    unbalanced brace (a code critique saying "the { is never closed") that would make a brace-matching
    parser swallow the JSON. Anything else goes to the general `parse_feedback`.
    """
    if not isinstance(text, str):
        return parse_feedback(text)
    head, _, last = text.rstrip().rpartition("\n")
    if last.lstrip().startswith("{"):
        result = parse_feedback(last)
        if result.ok and not result.repaired:
            critique = " ".join(head.split())
            return ParseResult(dataclasses.replace(result.feedback, critique=critique, raw=text), None, False)
    return parse_feedback(text)


@dataclass
class EncodedExample:
    """One tokenized training example. ``labels`` is -100 on the ``n_input`` input tokens, the target after."""

    input_ids: list[int]
    labels: list[int]
    n_input: int

    def as_dict(self) -> dict[str, list[int]]:
        return {"input_ids": self.input_ids, "labels": self.labels}


def encode_example(
    tokenizer,
    prompt: str,
    response: str,
    feedback: Feedback,
    *,
    max_length: int,
    instruction: str = DEFAULT_INSTRUCTION,
    prompt_format: PromptFormat = "auto",
    target_format: TargetFormat = "cot",
) -> EncodedExample | None:
    """Tokenize (x, y, z) for teacher forcing: input ids then target ids + EOS, loss on the target only.

    Returns None when the example cannot fit in ``max_length`` without cutting the response or the target.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; the reward model needs one to learn where z ends")
    target = list(tokenizer(target_text(feedback, target_format), add_special_tokens=False)["input_ids"])
    target.append(tokenizer.eos_token_id)
    input_ids = encode_input(
        tokenizer,
        prompt,
        response,
        instruction=instruction,
        prompt_format=prompt_format,
        max_input_length=max_length - len(target),
    )
    if len(input_ids) + len(target) > max_length:
        return None
    return EncodedExample(input_ids + target, [IGNORE_INDEX] * len(input_ids) + target, len(input_ids))


def record_spans(record: dict[str, Any]) -> list[CharSpan] | None:
    """A record's exact character intervals (``span_offsets``, written by feedback-ui and the Label Studio import),
    or None when it has none. Raises ValueError naming the record when they do not fit its response."""
    offsets = record.get("span_offsets")
    if not offsets:
        return None
    response = str(record.get("response", ""))
    out = []
    for n, span in enumerate(offsets, 1):
        start, end, label = span.get("start"), span.get("end"), span.get("label")
        if label not in ("good", "poor") or not all(isinstance(v, int) for v in (start, end)) \
                or not 0 <= start < end <= len(response):
            raise ValueError(f"record {record.get('id', '?')!r}: span_offsets entry {n} ({span}) is not a good/poor "
                             f"interval inside the response ({len(response)} characters)")
        if span.get("text") is not None and span["text"] != response[start:end]:
            raise ValueError(f"record {record.get('id', '?')!r}: span_offsets entry {n} says {span['text']!r} but the "
                             f"response holds {response[start:end]!r} there")
        out.append(CharSpan(start, end, GOOD if label == "good" else POOR, response[start:end]))
    return out


def _starts(text: str, quote: str) -> list[int]:
    found, at = [], text.find(quote)
    while at >= 0:
        found.append(at)
        at = text.find(quote, at + 1)
    return found


def _widened(text: str, start: int, end: int, left: int, right: int) -> tuple[int, int] | None:
    """[start, end) grown by ``left`` whitespace-separated words before it and ``right`` after it (with the spaces
    between), or None when the text has fewer words on a side."""
    for _ in range(right):
        if end >= len(text):
            return None
        while end < len(text) and text[end].isspace():
            end += 1
        while end < len(text) and not text[end].isspace():
            end += 1
    for _ in range(left):
        if start <= 0:
            return None
        while start > 0 and text[start - 1].isspace():
            start -= 1
        while start > 0 and not text[start - 1].isspace():
            start -= 1
    return start, end


def unambiguous_quote(response: str, span: CharSpan, spans: Sequence[CharSpan]) -> str:
    """The quote a critic should write for ``span`` so that locating it labels that place and no other.

    A quote labels every place it occurs (``occurrence: all``). When all of those places carry the same mark, the
    plain text is right. Otherwise (a person marked the second "Oslo" only) the quote is widened by the fewest
    neighbouring words that make it occur once, preferring words no other mark covers (right before left on a
    tie): the reward model learns to quote unambiguously, at the cost of those few words sharing the label.
    """
    quote = response[span.start:span.end]
    same = {(s.start, s.end) for s in spans if s.label == span.label}
    if all((at, at + len(quote)) in same for at in _starts(response, quote)):
        return quote
    others = [s for s in spans if (s.start, s.end) != (span.start, span.end)]
    fallback = None
    for total in range(1, len(response.split()) + 1):
        for left in range(total + 1):
            grown = _widened(response, span.start, span.end, left, total - left)
            if grown is None or len(_starts(response, response[grown[0]:grown[1]])) != 1:
                continue
            if not any(o.start < grown[1] and grown[0] < o.end for o in others):
                return response[grown[0]:grown[1]]
            fallback = fallback or grown
        if fallback is not None:
            return response[fallback[0]:fallback[1]]
    return quote


def record_feedback(record: dict[str, Any]) -> Feedback:
    """The reference feedback of an annotation record (``critique``, ``good_spans``, ``poor_spans``).

    A record with exact ``span_offsets`` (a person's marks) gets quotes from them, each made unambiguous
    (`unambiguous_quote`), so that training on it labels the marked occurrence, not every equal passage.
    """
    for key in ("good_spans", "poor_spans"):
        value = record.get(key)
        if value is not None and not isinstance(value, (list, tuple)):
            raise ValueError(
                f"record {record.get('id', '?')!r}: '{key}' must be a list of quotes, got {type(value).__name__}"
            )
    feedback = Feedback.from_dict(record)
    spans = record_spans(record)
    if spans is None:
        return feedback
    response = str(record["response"])
    quotes = {GOOD: [], POOR: []}
    for span in sorted(spans, key=lambda s: s.start):
        quote = unambiguous_quote(response, span, spans)
        if quote not in quotes[span.label]:
            quotes[span.label].append(quote)
    return dataclasses.replace(feedback, good_spans=tuple(quotes[GOOD]), poor_spans=tuple(quotes[POOR]))


def collate(examples: Sequence[dict[str, Sequence[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a training batch: input_ids with ``pad_token_id``, labels with -100, attention_mask 1/0.

    Returns tensors of shape (B, L) with L the longest example.
    """
    width = max(len(e["input_ids"]) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        input_ids[row, :n] = torch.as_tensor(list(e["input_ids"]), dtype=torch.long)
        labels[row, :n] = torch.as_tensor(list(e["labels"]), dtype=torch.long)
        mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}
