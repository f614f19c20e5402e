"""Batched reward-model inference: (prompt, response) pairs -> parsed Feedback.

`GenerativeRewardModel` is the one entry point the policy phase and the evaluation use; it is a critic
(`text2grad.core.critics.FeedbackSource`, registry name ``reward_model``)::

    rm = GenerativeRewardModel.from_pretrained("outputs/slf5k/reward_model")     # adapter dir or merged model
    feedback = rm.feedback(prompts, responses)                                   # one Feedback per pair

- The input is built by `reward_model.serialization` with the instruction and prompt format stored in the
  model directory's ``text2grad_config.yaml``, so the model is asked exactly the way it was trained.
- Generation is batched (inputs sorted by length, left padding, KV cache; `text2grad.core.generation.generate`),
  greedy by default, bounded by ``max_new_tokens``, and each row stops at EOS or as soon as it has written
  a complete span-JSON object.
- A generation that does not parse becomes ``Feedback.failed`` (no spans, zero reward) and is counted in
  `stats`; it never raises, so one bad critique never costs a PPO batch.
- Token rewards are not made here: the PPO trainer turns any critic's feedback into rewards on the exact ids
  the policy sampled with `text2grad.core.rewards.compute_score_rewards`.
- ``grounded_spans`` constrains the quotes to exact substrings of the response (`reward_model.decoding`).
- ``backend="vllm"`` serves the same interface from vLLM (`text2grad.core.vllm_engine`, imported only when asked
  for; CPU or GPU): the same token ids in, the same cut at the end of the JSON, and grounded span decoding as the
  same per-step constraint run per request inside the engine (`text2grad.core.vllm_logits`).
- ``backend="openai"`` sends the same token ids to an OpenAI-compatible server's completions endpoint
  (`reward_model.remote`; ``text2grad serve-critic`` starts vLLM's server for a trained reward model): the same
  greedy decoding, token limit and cut, concurrent requests with retries; a request that fails for good becomes
  ``Feedback.failed`` for its pair (counted in `stats` as ``request_errors``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
import yaml
from peft import PeftConfig

from reward_model.decoding import grounded_span_processors
from reward_model.remote import DEFAULT_API_KEY_ENV, RemoteCompletions
from reward_model.serialization import DEFAULT_INSTRUCTION, PromptFormat, RMInput, fit_rm_input, parse_target
from reward_model.train_config import CONFIG_FILENAME
from text2grad.core.feedback import Feedback
from text2grad.core.generation import finish_generation, generate
from text2grad.core.modeling import load_causal_lm, load_tokenizer, resolve_dtype
from text2grad.core.placement import resolve_device
from text2grad.core.vllm_engine import request_constraint, request_constraint_xargs, shared_engine, vllm_missing_message

__all__ = ["GenerativeRewardModel", "RewardModelStats", "json_complete", "cut_at_json", "CONFIG_FILENAME"]

logger = logging.getLogger("reward_model.inference")

Backend = Literal["hf", "vllm", "openai"]
BACKENDS = ("hf", "vllm", "openai")
# Grounded span decoding over the server: the constraint travels in each request's vllm_xargs (JSON text) and runs
# in the server's engine, which `text2grad serve-critic` starts with the project's logits processor.
GROUNDED_FACTORY = "reward_model.decoding:grounded_request_constraint"


def json_complete(text: str) -> bool:
    """True once ``text`` ends with a complete, valid span-JSON object (the end of z).

    Cheap on the common path (the text must end with ``}``), exact on the rest: the object must parse
    without repair, so a ``}`` inside a quoted span never stops generation early.
    """
    tail = text.rstrip()
    if not tail.endswith("}"):
        return False
    result = parse_target(tail)
    return result.ok and not result.repaired


def cut_at_json(text: str) -> str | None:
    """``text`` up to the first point where `json_complete` holds, or None if it never does.

    The HF backend stops generating there; vLLM cannot take a Python stop test, so its outputs are cut
    afterwards to the same text (anything written after the JSON would otherwise reach the parser).
    """
    end = text.find("}")
    while end != -1:
        if json_complete(text[: end + 1]):
            return text[: end + 1]
        end = text.find("}", end + 1)
    return None


@dataclass
class RewardModelStats:
    """Counters over the model's lifetime (or since `GenerativeRewardModel.reset_stats`)."""

    requests: int = 0  # (prompt, response) pairs asked for
    malformed: int = 0  # outputs that did not parse: empty feedback, zero reward
    truncated: int = 0  # outputs that hit max_new_tokens before EOS / the end of the JSON
    repaired: int = 0  # outputs that parsed only after repair (e.g. truncated JSON closed)
    bad_inputs: int = 0  # pairs that could not be rendered (e.g. not strings)
    request_errors: int = 0  # backend "openai": requests that failed for good (after retries)

    @property
    def malformed_rate(self) -> float:
        return self.malformed / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "malformed_rate": self.malformed_rate}


@dataclass
class _Output:
    text: str
    finished: bool
    error: str | None = None  # backend "openai": why the request failed (no text then)


def _read_training_config(*dirs: str | None) -> dict[str, Any]:
    """The ``text2grad_config.yaml`` saved by training, from the first directory that has one."""
    for d in dirs:
        if d and (Path(d) / CONFIG_FILENAME).is_file():
            data = yaml.safe_load((Path(d) / CONFIG_FILENAME).read_text()) or {}
            return data if isinstance(data, dict) else {}
    return {}


class GenerativeRewardModel:
    """A causal LM that writes z = critique + span JSON for (prompt, response) pairs.

    Args:
        model: a causal LM (plain, merged, or a PeftModel); ignored by the vLLM backend (pass None).
        tokenizer: the reward model's tokenizer.
        instruction, prompt_format: how inputs are rendered; must match training (``from_pretrained``
            reads them from ``text2grad_config.yaml``).
        max_new_tokens: bound on the critique + JSON length.
        batch_size: rows per generation batch.
        max_input_length: inputs longer than this have their task prompt shortened in the middle
            (the response is always kept whole).
        do_sample, temperature, top_p: greedy by default.
        stop_at_json: stop a row as soon as it has written a complete span-JSON object.
        grounded_spans: grounded span decoding (`reward_model.decoding.QuoteConstraint`; with vLLM the same
            constraint runs per request inside the engine, `reward_model.decoding.grounded_request_constraint`):
            every quote in the span lists is forced to be an exact substring of the response, so no span is
            lost as unmatched. The critique is generated freely. Off by default, so the model is measured as
            trained; the quickstart turns it on (see benchmarks/README.md for its effect).
        device: where ``model`` was placed (recorded as ``self.device``; default: its first parameter's device).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        instruction: str = DEFAULT_INSTRUCTION,
        prompt_format: PromptFormat = "auto",
        max_new_tokens: int = 512,
        batch_size: int = 16,
        max_input_length: int | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_at_json: bool = True,
        grounded_spans: bool = False,
        backend: Backend = "hf",
        engine: Any = None,
        device: torch.device | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if max_new_tokens <= 0 or batch_size <= 0:
            raise ValueError("max_new_tokens and batch_size must be positive")
        self.model = model
        self.tokenizer = tokenizer
        self.instruction = instruction
        self.prompt_format: PromptFormat = prompt_format
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.max_input_length = max_input_length
        self.do_sample = do_sample
        self.temperature = temperature
        self.top_p = top_p
        self.stop_at_json = stop_at_json
        self.grounded_spans = grounded_spans
        self.backend = backend
        self.engine = engine  # the vLLM wrapper (backend "vllm") or the server client (`RemoteCompletions`, "openai")
        self.stats = RewardModelStats()
        if backend == "hf" and model is None:
            raise ValueError("the 'hf' backend needs a model")
        if model is not None:
            model.eval()
        # Where the "hf" backend's model was placed (from_pretrained: this process's own device); None for vLLM.
        self.device = device if device is not None or model is None else next(model.parameters()).device

    # ----------------------------------------------------------------------------------------------
    # Loading
    # ----------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str,
        adapter: str | None = None,
        *,
        merge_adapter: bool = True,
        dtype: str | None = "auto",
        device: str | torch.device | None = None,
        backend: Backend = "hf",
        tokenizer_name_or_path: str | None = None,
        vllm_kwargs: dict[str, Any] | None = None,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        server_kwargs: dict[str, Any] | None = None,
        check_server: bool = True,
        **kwargs,
    ) -> "GenerativeRewardModel":
        """Load a trained reward model.

        Args:
            path_or_hub_id: a merged model, a full fine-tune, a training output directory holding a LoRA
                adapter (its base model is read from adapter_config.json), or a base model when ``adapter``
                is given.
            adapter: a LoRA adapter directory to put on ``path_or_hub_id``.
            merge_adapter: fold the adapter into the weights (same outputs, faster generation).
            dtype: "auto", "bf16", "fp16" or "fp32".
            device: default: this process's own device (`text2grad.core.placement.resolve_device`:
                ``cuda:<LOCAL_RANK>`` under a launcher, ``cuda:0`` alone, cpu without CUDA).
            backend: "hf" (transformers), "vllm" (in this process) or "openai" (an OpenAI-compatible server, e.g.
                the one ``text2grad serve-critic`` starts: only the tokenizer and the saved prompt format are read
                from ``path_or_hub_id``, no weights are loaded here).
            tokenizer_name_or_path: defaults to the adapter/model directory when it has tokenizer files.
            vllm_kwargs: extra arguments for ``vllm.LLM``, e.g. ``gpu_memory_utilization``: the share of its GPU
                each process's engine takes (`text2grad.core.vllm_engine.VLLMEngine`; under a launcher every process
                starts its own engine on its own GPU). Beside a training policy on the same GPU, leave it room.
            base_url, model: backend "openai": the server's OpenAI URL (``http://host:port/v1``) and the name it
                serves the reward model under.
            api_key, api_key_env: backend "openai": the server's key, or the environment variable holding it
                (default ``TEXT2GRAD_CRITIC_API_KEY``; in config files name the variable, not the key).
            server_kwargs: backend "openai": `reward_model.remote.RemoteCompletions` options (concurrency,
                timeout_s, max_retries, backoff_base_s, backoff_max_s).
            check_server: backend "openai": ask the server's ``/models`` now, so an unreachable server or a model
                name it does not serve fails here, before any training (`reward_model.remote.RemoteError`).
            **kwargs: GenerativeRewardModel options (max_new_tokens, batch_size, ...); they override
                what the saved training config says.
        """
        path = Path(path_or_hub_id)
        is_adapter_dir = (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()
        adapter_dir = adapter or (str(path) if is_adapter_dir else None)
        trained = _read_training_config(adapter_dir, str(path) if path.is_dir() else None)
        tok_source = tokenizer_name_or_path
        if tok_source is None:
            has_tok = lambda d: d and (Path(d) / "tokenizer_config.json").is_file()  # noqa: E731
            tok_source = next((d for d in (adapter_dir, str(path)) if has_tok(d)), None)
        if tok_source is None:
            tok_source = trained.get("tokenizer_name_or_path") or trained.get("model_name_or_path") or path_or_hub_id
        tokenizer = load_tokenizer(str(tok_source), padding_side="left")
        options: dict[str, Any] = {
            "instruction": trained.get("instruction", DEFAULT_INSTRUCTION),
            "prompt_format": trained.get("prompt_format", "auto"),
        }
        if trained.get("max_length"):
            options["max_input_length"] = int(trained["max_length"])
        options.update(kwargs)
        if backend == "openai":
            client = RemoteCompletions(base_url or "", model or "", api_key=api_key, api_key_env=api_key_env,
                                       **(server_kwargs or {}))
            if check_server:
                client.check()
            return cls(None, tokenizer, backend="openai", engine=client, **options)
        if backend == "vllm":  # under a launcher: this process's engine on its own GPU (vllm_engine.place_engine)
            base = path_or_hub_id
            if is_adapter_dir:
                base = PeftConfig.from_pretrained(str(path)).base_model_name_or_path
            engine = _VLLMEngine(base, adapter_dir, str(tok_source), dtype, vllm_kwargs or {})
            return cls(None, tokenizer, backend="vllm", engine=engine, **options)

        model = load_causal_lm(path_or_hub_id, adapter=adapter, dtype=dtype, merge_adapter=merge_adapter)
        placed = resolve_device(device)
        return cls(model.to(placed), tokenizer, device=placed, **options)

    @classmethod
    def from_critic_kwargs(
        cls, path: str | None = None, model_name_or_path: str | None = None, **kwargs: Any
    ) -> "GenerativeRewardModel":
        """The reward model as a critic (registry name ``reward_model`` in `text2grad.core.critics`).

        ``path`` (or ``model_name_or_path``) is the trained reward model; the other kwargs go to
        `from_pretrained`. Under a distributed launcher each process loads its own copy of the reward model
        onto its own GPU (``cuda:<LOCAL_RANK>``, `text2grad.core.placement`) unless ``device`` is given.
        """
        path = path or model_name_or_path
        if not path:
            raise ValueError("critic 'reward_model' needs the kwarg path (the trained reward model directory), "
                             "e.g. critic_kwargs: {path: outputs/slf5k/reward_model}")
        return cls.from_pretrained(path, **kwargs)

    # ----------------------------------------------------------------------------------------------
    # Feedback
    # ----------------------------------------------------------------------------------------------

    def reset_stats(self) -> RewardModelStats:
        """Zero the counters and return the old ones."""
        old, self.stats = self.stats, RewardModelStats()
        return old

    def _inputs(self, prompts: Sequence[str], responses: Sequence[str]) -> list[RMInput | str]:
        """Render each pair; a pair that cannot be rendered becomes its error message (a str)."""
        out: list[RMInput | str] = []
        for prompt, response in zip(prompts, responses):
            try:
                out.append(
                    fit_rm_input(
                        self.tokenizer,
                        prompt,
                        response,
                        instruction=self.instruction,
                        prompt_format=self.prompt_format,
                        max_input_length=self.max_input_length,
                    )
                )
            except (TypeError, ValueError) as exc:
                out.append(f"bad input: {exc}")
        return out

    def _generate(self, inputs: list[RMInput], responses: Sequence[str]) -> list[_Output]:
        if not inputs:
            return []
        # Longest first, so each batch pads little and an out-of-memory error shows up on the first batch.
        lengths = [len(self.tokenizer(i.text, add_special_tokens=i.add_special_tokens)["input_ids"]) for i in inputs]
        order = sorted(range(len(inputs)), key=lambda k: lengths[k], reverse=True)
        results: dict[int, _Output] = {}
        if self.backend == "vllm":
            ids = [self.tokenizer(inputs[k].text, add_special_tokens=inputs[k].add_special_tokens)["input_ids"] for k in order]
            generated = self.engine.generate(
                self.tokenizer, ids, self.max_new_tokens, do_sample=self.do_sample, temperature=self.temperature,
                top_p=self.top_p, grounded_sources=[responses[k] for k in order] if self.grounded_spans else None,
            )
            for k, (text, finished) in zip(order, generated):
                results[k] = self._cut(text, finished)
        elif self.backend == "openai":
            ids = [self.tokenizer(i.text, add_special_tokens=i.add_special_tokens)["input_ids"] for i in inputs]
            extras = None
            if self.grounded_spans:  # the constraint runs in the server's engine (serve-critic installs it)
                extras = [{"vllm_xargs": request_constraint_xargs(GROUNDED_FACTORY, source=r)} for r in responses]
            outputs = self.engine.generate(ids, self.max_new_tokens, do_sample=self.do_sample,
                                           temperature=self.temperature, top_p=self.top_p, extra_bodies=extras)
            for k, out in enumerate(outputs):
                if out.error is not None:
                    results[k] = _Output("", False, out.error)
                    continue
                text = out.text
                if out.token_ids is not None:  # decoded here, as the in-process backends decode their ids
                    text = finish_generation(self.tokenizer, ids[k], out.token_ids, self._eos_ids()).text
                results[k] = self._cut(text, out.finished)
        else:
            for flag in (True, False):  # plain-template and chat-template inputs tokenize differently
                group = [k for k in order if inputs[k].add_special_tokens is flag]
                if not group:
                    continue
                gens = generate(
                    self.model,
                    self.tokenizer,
                    [inputs[k].text for k in group],
                    max_new_tokens=self.max_new_tokens,
                    batch_size=self.batch_size,
                    do_sample=self.do_sample,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    add_special_tokens=flag,
                    stop_fn=json_complete if self.stop_at_json else None,
                    logits_processors=(
                        grounded_span_processors(self.tokenizer, [responses[k] for k in group]) if self.grounded_spans else None
                    ),
                )
                for k, g in zip(group, gens):
                    results[k] = _Output(g.text, g.finished)
        return [results[k] for k in range(len(inputs))]

    def _cut(self, text: str, finished: bool) -> _Output:
        """An engine's output cut at the end of the span JSON (where the "hf" backend stops generating)."""
        cut = cut_at_json(text) if self.stop_at_json else None
        return _Output(cut, True) if cut is not None else _Output(text, finished)

    def _eos_ids(self) -> list[int]:
        return [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []

    def generate_feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        """One `Feedback` per (prompt, response), in order. Malformed outputs are `Feedback.failed` and counted."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses; pass one prompt per response")
        inputs = self._inputs(prompts, responses)
        good = [k for k, i in enumerate(inputs) if isinstance(i, RMInput)]
        outputs = dict(zip(good, self._generate([inputs[k] for k in good], [responses[k] for k in good])))  # type: ignore[list-item]
        results: list[Feedback] = []
        for k, item in enumerate(inputs):
            self.stats.requests += 1
            if isinstance(item, str):
                self.stats.bad_inputs += 1
                self.stats.malformed += 1
                results.append(Feedback.failed(item))
                continue
            out = outputs[k]
            if out.error is not None:
                self.stats.request_errors += 1
                self.stats.malformed += 1
                results.append(Feedback.failed(out.error))
                continue
            if not out.finished:
                self.stats.truncated += 1
            parsed = parse_target(out.text)
            if not parsed.ok:
                self.stats.malformed += 1
                results.append(Feedback.failed(parsed.error or "unparseable output", raw=out.text))
                continue
            self.stats.repaired += int(parsed.repaired)
            results.append(parsed.feedback)
        return results

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        """`text2grad.core.critics.FeedbackSource` protocol: same as `generate_feedback`."""
        return self.generate_feedback(prompts, responses)


class _VLLMEngine:
    """The vLLM backend: this process's shared engine (`text2grad.core.vllm_engine.shared_engine`, so a PPO run
    whose policy has the same base model uses the same engine) with the reward model's LoRA adapter, if any."""

    def __init__(self, model: str, adapter: str | None, tokenizer: str, dtype: str | None, engine_kwargs: dict):
        rank = int(json.loads((Path(adapter) / "adapter_config.json").read_text()).get("r", 16)) if adapter else None
        try:
            self.engine = shared_engine(model, tokenizer=tokenizer, dtype=dtype, max_lora_rank=rank, **engine_kwargs)
        except ImportError as exc:
            raise ImportError(vllm_missing_message("backend='vllm'")) from exc
        # what a trainer needs to rebuild the reward model in transformers (`policy_optimization.rm_refresh`)
        self.base_model, self.adapter_dir, self.dtype = model, adapter, dtype
        self.weights = None
        if adapter:
            self.serve_adapter(adapter)

    def serve_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the LoRA adapter saved in ``adapter_dir`` from now on (an adapter of the same base model, e.g.
        the reward model after a refresh): a new LoRA request, or (lora_mode merged) the adapter folded into whole
        weights the engine swaps in. The folder must stay until the next call (vLLM may read it lazily)."""
        self.weights = self.engine.adapter(adapter_dir, name="text2grad-reward-model")
        self.adapter_dir = str(adapter_dir)

    def generate(
        self, tokenizer, input_ids: list[list[int]], max_new_tokens: int, *, do_sample: bool, temperature: float,
        top_p: float, grounded_sources: Sequence[str] | None = None,
    ) -> list[tuple[str, bool]]:
        """``grounded_sources``: per input, the response its quotes must come from (grounded span decoding)."""
        constraints = None if grounded_sources is None else [
            request_constraint(GROUNDED_FACTORY, source=source)
            for source in grounded_sources
        ]
        rows = self.engine.generate(
            tokenizer, input_ids, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
            top_p=top_p, weights=self.weights, constraints=constraints,
        )
        return [(row.text, row.finished) for row in rows]
