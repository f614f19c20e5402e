"""Generating from a model with either backend, transformers or vLLM, through one object (`TextGenerator`).

The evaluation suites (summarization, QA, code pass@k) and the sampling of responses to annotate (prepare-data's
KodCode completions) choose with a ``generation_backend: hf | vllm`` setting and call `load_text_generator`; PPO
has its own vLLM path because its engine must follow the policy as it trains
(`policy_optimization/vllm_rollouts.py`). The two backends are interchangeable:

- **Same prompt ids.** Both encode prompts with `text2grad.core.generation.encode_prompt_ids` rules (the special
  tokens rule, or the caller's ``add_special_tokens``; prompts cut from the left at ``max_prompt_length``), so vLLM
  conditions on exactly the ids transformers would. A chat template is applied by the caller, as before.
- **Same weights.** A LoRA adapter is merged into the weights for transformers and served as a LoRA request on
  its base model by vLLM; a full model (merged or fully fine-tuned) is loaded directly by both.
- **Same outputs.** `text2grad.core.generation.Generation` rows cut the same way (first EOS kept, stop strings).
  Greedy decoding gives the same tokens up to floating-point near-ties (tested on SmolLM2). Sampling draws
  differ: with vLLM it follows the engine's random stream (started from the engine's seed), not ``seed``, because
  vLLM 0.32 on CPU fails seeded requests whose prompts it prefills in chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from peft import PeftConfig

from text2grad.core.generation import Generation, encode_prompt_ids, generate
from text2grad.core.generation_options import GENERATION_BACKENDS, GenerationBackend
from text2grad.core.modeling import load_causal_lm, load_tokenizer
from text2grad.core.vllm_engine import shared_engine, vllm_available, vllm_missing_message

__all__ = ["ModelSource", "resolve_model_source", "TextGenerator", "load_text_generator"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's parts come from.

    Attributes:
        base: the weights to load (a hub id or directory): the base model under a LoRA adapter, else the model.
        adapter: the LoRA adapter directory, or None.
        tokenizer: the tokenizer's hub id or directory (the adapter's own when it saved one: training saves the
            tokenizer next to the adapter, possibly with added tokens).
    """

    base: str
    adapter: str | None
    tokenizer: str


def resolve_model_source(model: str, adapter: str | None = None) -> ModelSource:
    """The parts of a model named the way users name it: a hub id, a local directory, a base model plus a LoRA
    ``adapter``, or a directory that holds only an adapter (its base read from ``adapter_config.json``)."""
    path = Path(model).expanduser()
    base = model
    if adapter is None and (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        adapter = str(path)
        base = PeftConfig.from_pretrained(adapter).base_model_name_or_path
        if not base:
            raise ValueError(
                f"{path} holds only a LoRA adapter and its adapter_config.json names no base model; pass the base "
                "model as the model and this directory as the adapter"
            )
    tokenizer = adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else base
    return ModelSource(base=base, adapter=adapter, tokenizer=tokenizer)


class TextGenerator:
    """Generates continuations of text prompts with transformers (``model``) or a vLLM engine (``engine`` plus
    the ``weights`` it serves an adapter from: `text2grad.core.vllm_engine.VLLMEngine.adapter`). Build one with
    `load_text_generator` (or directly from a loaded model)."""

    def __init__(self, tokenizer, *, model=None, engine=None, weights=None):
        if (model is None) == (engine is None):
            raise ValueError("a TextGenerator needs exactly one of model (transformers) or engine (vLLM)")
        self.tokenizer, self.model, self.engine, self.weights = tokenizer, model, engine, weights

    @property
    def backend(self) -> GenerationBackend:
        return "hf" if self.model is not None else "vllm"

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_new_tokens: int,
        batch_size: int = 16,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_length: int | None = None,
        stop_strings: Sequence[str] | None = None,
        add_special_tokens: bool | None = None,
        seed: int | None = None,
        progress_bar: bool = False,
    ) -> list[Generation]:
        """One `Generation` per prompt, in order; the arguments mean what they mean for
        `text2grad.core.generation.generate`. ``batch_size`` and ``seed`` are transformers settings: vLLM
        schedules the whole list itself and samples from its engine's random stream."""
        if self.model is not None:
            return generate(
                self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                do_sample=do_sample, temperature=temperature, top_p=top_p, max_prompt_length=max_prompt_length,
                stop_strings=stop_strings, add_special_tokens=add_special_tokens, generator_seed=seed,
                progress_bar=progress_bar,
            )
        if not prompts:
            return []
        ids = encode_prompt_ids(self.tokenizer, prompts, add_special_tokens, max_prompt_length)
        return self.engine.generate(
            self.tokenizer, ids, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
            top_p=top_p, stop_strings=stop_strings, weights=self.weights, progress_bar=progress_bar,
        )


def load_text_generator(
    backend: str,
    model: str,
    adapter: str | None = None,
    *,
    dtype: str | None = "auto",
    device: str | torch.device | None = None,
    tokenizer: str | None = None,
    vllm_kwargs: dict[str, Any] | None = None,
) -> TextGenerator:
    """A `TextGenerator` for ``model`` (+ ``adapter``; see `resolve_model_source`) on ``backend``.

    hf: the model loaded with transformers, the adapter merged, in eval mode on ``device`` (default: a GPU if
    visible). vllm: this process's shared engine (`text2grad.core.vllm_engine.shared_engine`) on the base weights
    with ``vllm_kwargs``, the adapter as a LoRA request or merged into whole weights (``lora_mode`` in ``vllm_kwargs``); ``device`` is not used (vLLM places its engine itself).
    ``tokenizer`` overrides the tokenizer `resolve_model_source` picks. Raises ImportError (saying how to install
    it) when vllm is asked for and not importable, before any model is loaded.
    """
    if backend not in GENERATION_BACKENDS:
        raise ValueError(f"generation_backend must be one of {', '.join(GENERATION_BACKENDS)}, got {backend!r}")
    if backend == "vllm" and not vllm_available():
        raise ImportError(vllm_missing_message("generation_backend 'vllm'"))
    source = resolve_model_source(model, adapter)
    tokenizer_source = tokenizer or source.tokenizer
    text_tokenizer = load_tokenizer(tokenizer_source, padding_side="left")
    if backend == "hf":
        policy = load_causal_lm(source.base, adapter=source.adapter, dtype=dtype, merge_adapter=True)
        placed = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return TextGenerator(text_tokenizer, model=policy.to(placed).eval())
    rank = _adapter_rank(source.adapter) if source.adapter else None
    # The engine runs the base model with the base's tokenizer (so a policy and a reward model on one base share
    # it); the adapter's own tokenizer encodes the prompts and decodes the outputs here, which is only the same
    # thing while it has the base's vocabulary.
    engine = shared_engine(source.base, tokenizer=tokenizer, dtype=dtype, max_lora_rank=rank, **(vllm_kwargs or {}))
    engine_vocab = len(engine.llm.get_tokenizer())
    if len(text_tokenizer) > engine_vocab:
        raise ValueError(
            f"the tokenizer in {tokenizer_source} has {len(text_tokenizer)} tokens, the base model's {engine_vocab} "
            "(tokens were added in training): vLLM serves LoRA adapters without new token embeddings; use "
            "generation_backend hf, or merge the adapter into a full model (reward_model.merge) and pass that"
        )
    weights = engine.adapter(source.adapter, name=f"adapter-{Path(source.adapter).name}") if source.adapter else None
    return TextGenerator(text_tokenizer, engine=engine, weights=weights)


def _adapter_rank(adapter_dir: str) -> int:
    """The LoRA rank a peft adapter was saved with (``r`` in its adapter_config.json)."""
    config = Path(adapter_dir) / "adapter_config.json"
    if not config.is_file():
        raise ValueError(f"adapter {adapter_dir} has no adapter_config.json; pass a directory saved by peft's save_pretrained")
    return int(json.loads(config.read_text()).get("r", 16))
