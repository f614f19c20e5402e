"""Batched generation shared by the reward model, the policy trainer and the evaluation scripts.

Prompts are left-padded so every row's new tokens start at the same column, the KV cache is on, and
the exact generated token ids are returned (rewards must land on the ids the model sampled, not on a
re-tokenization of the decoded text).

**Special tokens rule** (every phase follows it: PPO, evaluation, the reward model, the quickstart): text that a
chat template rendered (`apply_chat_template`) already holds every special token the model expects, BOS
included, so it is tokenized with ``add_special_tokens=False``; plain text is tokenized with
``add_special_tokens=True`` (the tokenizer adds BOS if its model wants one). Tokenizing templated text with
special tokens again gives Llama-3 ``<|begin_of_text|><|begin_of_text|>`` and Mistral ``<s><s>``.
`generate`'s default (``add_special_tokens=None``) applies the rule per prompt through
`prompt_add_special_tokens`; callers that know a prompt was templated pass ``False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessorList, StoppingCriteriaList

__all__ = [
    "Generation", "generate", "apply_chat_template", "prompt_add_special_tokens", "encode_prompt_ids", "finish_generation",
]


@dataclass
class Generation:
    """One generated continuation.

    Attributes:
        prompt_ids: the prompt's token ids (no padding).
        response_ids: generated ids up to and including the first EOS (no padding).
        text: ``response_ids`` decoded without special tokens.
        finished: True if the model emitted EOS (or a stop string) before ``max_new_tokens``.
        sampled_logprobs: the generating engine's log-probability of each response token, where it reports them
            (the vLLM engine, `text2grad.core.vllm_engine`); None from transformers' generate.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    finished: bool
    sampled_logprobs: list[float] | None = None


def apply_chat_template(tokenizer, prompt: str, system: str | None = None) -> str:
    """Wrap ``prompt`` in the tokenizer's chat template if it has one; otherwise return it unchanged."""
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_add_special_tokens(tokenizer, text: str) -> bool:
    """The special-tokens rule for a prompt whose origin is unknown: False when ``text`` already starts with the
    tokenizer's BOS token (rendered by a chat template or written by hand), True otherwise.

    A template that writes no BOS (ChatML: Qwen, SmolLM2) renders text whose tokenizer adds none either, so the
    answer is the same there; for a tokenizer that adds BOS under a template that leaves it out, pass
    ``add_special_tokens=False`` explicitly.
    """
    bos = getattr(tokenizer, "bos_token", None)
    return not (isinstance(bos, str) and bos and text.startswith(bos))


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
    add_special_tokens: bool | None = None,
    generator_seed: int | None = None,
    progress_bar: bool = False,
    stop_fn: Callable[[str], bool] | None = None,
    logits_processors: Callable[[range, int], Sequence[Any]] | None = None,
    synced_gpus: bool = False,
) -> list[Generation]:
    """Generate one continuation per prompt, in order, in batches of ``batch_size``.

    ``max_prompt_length`` truncates prompts from the left (keeping their end, where the question is).
    ``add_special_tokens``: True/False for every prompt, or None (default) for the module's special tokens rule
    per prompt (`prompt_add_special_tokens`: no second BOS on text that already starts with one).
    ``stop_strings`` end a row once its decoded text contains one of them; the text is cut just after
    the stop string and the ids are cut to the tokens that produced it. ``stop_fn`` is the general form:
    a row stops as soon as ``stop_fn(decoded new text)`` is true (e.g. "a complete JSON object has been
    written"), and its ids are cut to the shortest prefix whose text satisfies it.
    ``logits_processors`` is the hook for constrained decoding: called once per batch as
    ``logits_processors(rows, prompt_width)`` (``rows``: the indices into ``prompts`` of the batch's rows, in
    order; ``prompt_width``: the padded prompt length, where the new tokens start), it returns the
    transformers logits processors for that batch (the reward model's grounded span decoding,
    `reward_model.decoding.grounded_span_processors`, is one).
    ``synced_gpus`` keeps every process of a distributed run generating until all have finished (needed when the
    weights are ZeRO-3 partitions that all processes fetch together at every step).
    """
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    device = next(model.parameters()).device
    old_side, old_trunc = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    eos_ids = _eos_ids(model, tokenizer)
    outputs: list[Generation] = []
    starts = range(0, len(prompts), batch_size)
    if progress_bar:
        starts = tqdm(starts, desc="generate", unit="batch")
    try:
        for start in starts:
            batch = list(prompts[start : start + batch_size])
            enc = _encode_prompts(tokenizer, batch, add_special_tokens, max_prompt_length)
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
                gen_kwargs.update(stopping_criteria=StoppingCriteriaList([_TextStop(tokenizer, width, stop_fn)]))
            if synced_gpus:  # ZeRO-3 without gathered weights: every process steps until all have finished
                gen_kwargs.update(synced_gpus=True)
            if logits_processors is not None:
                rows = range(start, start + len(batch))
                gen_kwargs.update(logits_processor=LogitsProcessorList(list(logits_processors(rows, width))))
            sequences = model.generate(**enc, **gen_kwargs)
            for row in range(len(batch)):
                prompt_ids = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
                new = sequences[row, width:].tolist()
                outputs.append(_finish(tokenizer, prompt_ids, new, eos_ids, stop_strings, stop_fn))
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = old_side, old_trunc
    return outputs


def encode_prompt_ids(
    tokenizer, prompts: Sequence[str], add_special_tokens: bool | None = None, max_prompt_length: int | None = None
) -> list[list[int]]:
    """The token ids `generate` conditions on, one list per prompt (no padding): the special tokens rule per prompt
    (``add_special_tokens=None``) or for all, prompts longer than ``max_prompt_length`` cut from the left. Engines
    that take token ids (vLLM) get their prompts from here, so both backends see the same ids."""
    old_side, old_trunc = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    try:
        enc = _encode_prompts(tokenizer, list(prompts), add_special_tokens, max_prompt_length)
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = old_side, old_trunc
    return [ids[mask.bool()].tolist() for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]


def finish_generation(tokenizer, prompt_ids: list[int], new_ids: Sequence[int], eos_ids: Sequence[int],
                      stop_strings: Sequence[str] | None = None) -> Generation:
    """A `Generation` from a prompt's ids and the ids an engine generated after it, cut as `generate` cuts: at
    the first EOS (kept), or just after the token that completed a stop string."""
    return _finish(tokenizer, list(prompt_ids), list(new_ids), list(eos_ids), stop_strings)


def _encode_prompts(tokenizer, prompts: list[str], add_special_tokens: bool | None, max_prompt_length: int | None):
    """Left-padded ``input_ids``/``attention_mask`` tensors; prompts with and without special tokens may mix."""
    flags = [add_special_tokens if add_special_tokens is not None else prompt_add_special_tokens(tokenizer, p) for p in prompts]
    kwargs = dict(truncation=max_prompt_length is not None, max_length=max_prompt_length)
    if len(set(flags)) == 1:
        return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=flags[0], **kwargs)
    rows = [tokenizer(p, add_special_tokens=f, **kwargs) for p, f in zip(prompts, flags)]
    return tokenizer.pad([{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"]} for r in rows], return_tensors="pt")


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

