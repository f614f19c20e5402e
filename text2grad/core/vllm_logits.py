"""Per-request logits constraints inside the vLLM engine (such as the reward model's grounded span decoding).

vLLM 0.32 (its V1 engine, CPU and GPU builds) applies logits processors in the engine's own process: the classes
are installed when the engine starts (``vllm.LLM(logits_processors=[...])``) and each decides per request, from
the request's ``SamplingParams.extra_args``, whether it acts on it. Every `text2grad.core.vllm_engine.VLLMEngine`
installs `RequestLogits`, so one engine serves constrained and unconstrained requests side by side (PPO's rollouts
and the reward model's grounded critiques share it). A request sent with
``text2grad.core.vllm_engine.request_constraint("package.module:function", **kwargs)`` in its ``extra_args`` gets
``function(tokenizer, **kwargs)`` (the engine's tokenizer; kwargs must be plain JSON-like values), which returns ``constrain(generated_ids: list[int], logits: Tensor[V]) -> Tensor[V]``, called before each token of that
request is chosen, greedy or sampled; other requests are untouched. The factory is loaded by name
(`text2grad.core.critics.load_object`) in the engine's process, so it must live in an importable module.

This module imports vllm at the top: vLLM loads it by name
(``text2grad.core.vllm_engine.REQUEST_LOGITS_PROCESSOR``) in its engine process; the project's code never imports
it.
"""

from __future__ import annotations

import json
from typing import Callable

import torch
from transformers import AutoTokenizer
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from text2grad.core.critics import load_object
from text2grad.core.vllm_engine import _REQUEST_LOGITS_ARG

__all__ = ["RequestLogits"]


class RequestLogits(AdapterLogitsProcessor):
    """vLLM's per-request adapter for the constraints named in requests' ``extra_args`` (see the module docs)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        super().__init__(vllm_config, device, is_pin_memory)
        self._tokenizer_name = vllm_config.model_config.tokenizer
        self._tokenizer = None

    def is_argmax_invariant(self) -> bool:
        return False  # a constraint can change the most likely token, so greedy requests need it too

    def new_req_logits_processor(self, params) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        spec = (params.extra_args or {}).get(_REQUEST_LOGITS_ARG)
        if spec is None:
            return None
        if isinstance(spec, str):  # sent through the OpenAI server's vllm_xargs, whose values are flat: JSON text
            spec = json.loads(spec)
        if self._tokenizer is None:  # loaded once per engine, on the first constrained request
            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
        return load_object(spec["factory"])(self._tokenizer, **spec.get("kwargs", {}))
