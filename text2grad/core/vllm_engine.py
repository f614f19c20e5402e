"""vLLM as a generation engine: token ids in, the exact sampled token ids (and their log-probs) out.

PPO rollouts (``--generation_backend vllm``), the reward model's critiques (``backend="vllm"``) and the
benchmarks share this one wrapper, so one engine per process serves them all (`shared_engine`): a LoRA policy and
a LoRA reward model on the same base model share one engine.

- **How an adapter is served** (``lora_mode``): "adapter" serves each LoRA adapter as a vLLM `LoRARequest` on the
  engine's base weights; "merged" folds the adapter into whole weights on the host
  (`text2grad.core.modeling.merged_weights`) and loads them into the engine in place whenever a request asks
  for other weights than the engine holds (the engine then runs without LoRA kernels). "auto" (the default) is
  "adapter" on a GPU and "merged" on a CPU, where vLLM's LoRA kernels are slow and swapping a small model's weights
  is cheap (both measured in benchmarks/README.md, "vLLM vs transformers generation"). Full fine-tuning's updated weights take the merged
  road too (`VLLMEngine.weights`).

- **Prompts are token ids**, encoded by `text2grad.core.generation.encode_prompt_ids` with the project's special
  tokens rule (one BOS), so vLLM sees exactly the ids the transformers backend would; vLLM never re-tokenizes text.
- **Outputs** become `text2grad.core.generation.Generation` rows through the same cut as transformers' generate
  (first EOS kept, stop strings), with ``sampled_logprobs``: vLLM's own log-probabilities of the sampled tokens,
  after temperature (``logprobs_mode="processed_logprobs"``), for checking that the engine holds the current policy.
- **Per-request logits constraints** (``generate(..., constraints=[request_constraint(...), ...])``): every engine
  installs `text2grad.core.vllm_logits.RequestLogits`, which applies a named constraint function to the requests
  that carry one (the reward model's grounded span decoding) and leaves the others untouched.
- **vLLM starts its engine in a spawned process**: a script that builds a `VLLMEngine` must do so under
  ``if __name__ == "__main__":`` (the spawned process re-imports the main module). That engine core runs until it is
  told to stop, so a process killed without closing its engine (SIGKILL, the out-of-memory killer, a study worker
  ended with its study) would leave it behind, spinning a core and holding gigabytes. Every engine therefore gets a
  small reaper process (`EngineReaper`) that ends the engine's processes when the process that started it dies.
- **Placement and memory** (`text2grad.core.placement.engine_placement`): under a launcher every process starts its
  own engine. On GPUs process k's engine runs on the process's own GPU (visible GPU k, passed to vLLM as
  ``device_ids``) and takes ``gpu_memory_utilization`` of it (weights + KV cache), which must leave room for the
  training models beside it. On a CPU the machine's KV-cache budget (``cpu_kv_cache_gb``, or
  ``VLLM_CPU_KVCACHE_SPACE`` GiB when the environment sets it) is split evenly between the processes' engines,
  and each engine binds its threads to its own slice of the cores (a lone process's engine to all of its cores).

Install: ``TEXT2GRAD_EXTRAS=...,vllm bash env.sh`` (vLLM's CPU build on a CPU-only machine, the CUDA build next to
a CUDA torch); ``pip install 'text2grad[vllm]'`` for the CUDA build.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import psutil
import torch
from safetensors.torch import save_file
from transformers import GenerationConfig

from text2grad.core.generation import Generation, finish_generation
from text2grad.core.modeling import load_causal_lm, merged_weights, resolve_dtype
from text2grad.core.placement import EnginePlacement, engine_placement, local_rank, local_world_size, visible_gpus

__all__ = [
    "VLLMEngine", "EngineKey", "EngineWeights", "LoraMode", "LORA_MODES", "resolve_lora_mode", "LORA_RANKS",
    "lora_rank_slot", "place_engine", "shared_engine", "close_shared_engine", "vllm_available",
    "vllm_missing_message", "REQUEST_LOGITS_PROCESSOR", "request_constraint", "request_constraint_xargs",
    "CPU_WORKER_SPIN_SECONDS", "EngineReaper",
]

logger = logging.getLogger(__name__)

LoraMode = Literal["auto", "merged", "adapter"]
LORA_MODES = ("auto", "merged", "adapter")
# The LoRA ranks vLLM accepts for max_lora_rank (vllm.config.lora.MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# On a CPU the engine's worker would otherwise spin one core for a second after every request (vLLM's shared-memory
# queue), a core the training steps between requests need (measured in benchmarks/README.md).
CPU_WORKER_SPIN_SECONDS = 0.05
# Installed in every engine: runs the per-request constraints named in requests' extra_args
# (`text2grad.core.vllm_logits`, loaded by vLLM by name in its engine process).
REQUEST_LOGITS_PROCESSOR = "text2grad.core.vllm_logits:RequestLogits"
_REQUEST_LOGITS_ARG = "text2grad_logits"


def request_constraint(factory: str, **kwargs: Any) -> dict[str, Any]:
    """One request's logits constraint for `VLLMEngine.generate` (``constraints``): ``factory`` ("package.module:
    function") is called in the engine's process as ``function(tokenizer, **kwargs)`` (plain JSON-like kwargs) and
    returns ``constrain(generated_ids, logits) -> logits``, applied before each token of that request is chosen
    (`text2grad.core.vllm_logits`)."""
    return {_REQUEST_LOGITS_ARG: {"factory": factory, "kwargs": kwargs}}


def request_constraint_xargs(factory: str, **kwargs: Any) -> dict[str, str]:
    """The same constraint as `request_constraint`, in the form vLLM's OpenAI server takes it: a request's
    ``vllm_xargs`` (whose values must be flat), the spec as JSON text. The server must have been started with
    ``--logits-processors`` `REQUEST_LOGITS_PROCESSOR` (``text2grad serve-critic`` does so)."""
    return {_REQUEST_LOGITS_ARG: json.dumps(request_constraint(factory, **kwargs)[_REQUEST_LOGITS_ARG])}


def vllm_available() -> bool:
    """True when ``import vllm`` works in this environment."""
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install (e.g. media wheels built for another torch) counts as missing
        return False
    return True


def vllm_missing_message(what: str) -> str:
    """The error text for ``what`` needing vLLM where it is not importable."""
    return (
        f"{what} needs the vllm package, which is not importable here. Install it with "
        "`TEXT2GRAD_EXTRAS=test,offline-eval,real-assets,vllm bash env.sh` (vLLM's CPU build on a CPU-only Linux "
        "machine, the CUDA build next to a CUDA torch) or `pip install 'text2grad[vllm]'` (CUDA), or use the "
        "transformers backend ('hf')."
    )


def resolve_lora_mode(mode: str, on_gpu: bool | None = None) -> Literal["merged", "adapter"]:
    """How this process's engine serves LoRA adapters: ``mode`` itself, or for "auto" "adapter" where a GPU is
    visible (``on_gpu``; default: `text2grad.core.placement.visible_gpus`) and "merged" on a CPU."""
    if mode not in LORA_MODES:
        raise ValueError(f"lora_mode must be one of {', '.join(LORA_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode  # type: ignore[return-value]
    on_gpu = bool(visible_gpus()) if on_gpu is None else on_gpu
    return "adapter" if on_gpu else "merged"


@dataclass(frozen=True)
class EngineWeights:
    """Whole weights an engine loads in place of the ones it holds before it serves a request that names them
    (`VLLMEngine.generate`'s ``weights``): a LoRA adapter merged on the host, or a full fine-tune's current weights.
    ``folder`` holds them as safetensors, under the base checkpoint's names."""

    name: str
    folder: Path


def lora_rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds a LoRA of rank ``rank`` (at least 16, so a
    policy adapter and a reward-model adapter of the usual ranks share one engine)."""
    for slot in LORA_RANKS:
        if slot >= max(rank, 16):
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest supported rank {LORA_RANKS[-1]}")


@dataclass(frozen=True)
class EngineKey:
    """What makes two engines interchangeable: same weights, tokenizer, dtype, LoRA slots and options."""

    model: str
    tokenizer: str
    dtype: str
    max_lora_rank: int | None
    options: tuple[tuple[str, Any], ...] = field(default=())
    lora_mode: str = "merged"


class VLLMEngine:
    """One vLLM engine (`vllm.LLM`), started on construction.

    Args:
        model: a local model folder (or hub id) with safetensors weights.
        tokenizer: the tokenizer folder (default: ``model``); the engine only decodes with it.
        dtype: "auto", "fp32"/"float32", "bf16"/"bfloat16", "fp16" (the project's names or torch's).
        max_lora_rank: serve LoRA adapters up to this rank as vLLM LoRA requests (None: no LoRA kernels;
            `adapter` then merges adapters into whole weights that the engine loads in place).
        gpu_memory_utilization: the engine's share of its GPU (GPU only; None: vLLM's default 0.9, which leaves
            no room for a training model on the same GPU).
        cpu_kv_cache_gb: the KV cache on CPU, in GiB, for all the engines on this machine together (split evenly
            between a launcher's processes); ``VLLM_CPU_KVCACHE_SPACE`` in the environment takes precedence.
        max_model_len: the longest prompt + response the engine plans for (default: the model's maximum).
        seed: the engine's sampling seed (plus the process's rank under a launcher, so processes draw different
            samples).
        **engine_kwargs: anything else for `vllm.LLM` (e.g. ``enforce_eager``).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: str | Path | None = None,
        dtype: str | None = "auto",
        max_lora_rank: int | None = None,
        gpu_memory_utilization: float | None = None,
        cpu_kv_cache_gb: float = 1.0,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(vllm_missing_message("the vLLM generation engine")) from exc

        self.placement = place_engine(gpu_memory_utilization, cpu_kv_cache_gb)
        # an in-place weight load sends a function to the engine's own worker process (apply_model), which vLLM only
        # unpickles with this switch; the channel is a local one between this process and the engine it started.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self.model_path, self.tokenizer_path = str(model), str(tokenizer or model)
        self.max_lora_rank = max_lora_rank
        kwargs: dict[str, Any] = dict(
            model=self.model_path, tokenizer=self.tokenizer_path, dtype=_vllm_dtype(dtype),
            seed=seed + int(os.environ.get("RANK") or 0),
            # log-probs after temperature, top-k and top-p: comparable with the trainer's logits / temperature
            logprobs_mode="processed_logprobs",
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if max_lora_rank is not None:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank_slot(max_lora_rank), max_loras=2)
        kwargs.update(self.placement.engine_kwargs())
        if self.placement.gpu_index is None:
            kwargs.setdefault("enforce_eager", True)  # no graph capture on CPU: start-up in seconds, same outputs
        kwargs.update(engine_kwargs)
        kwargs["logits_processors"] = [REQUEST_LOGITS_PROCESSOR, *engine_kwargs.get("logits_processors", [])]
        logger.info("starting the vLLM engine for %s (dtype %s, LoRA %s) on %s", self.model_path, kwargs["dtype"],
                    kwargs.get("max_lora_rank", "off"), self.placement.describe())
        # the engine's processes are spawned inside LLM() and inherit the environment as it is then
        before = EngineReaper.descendants()
        with _environment(self.placement.environment()):
            self.llm = LLM(**kwargs)
        self._reaper = EngineReaper.start(EngineReaper.descendants() - before)
        self._next_lora_id = 1
        self._eos_ids = _eos_token_ids(self.model_path, self.llm.get_tokenizer())
        if self.placement.gpu_index is None:
            self.set_worker_spin(CPU_WORKER_SPIN_SECONDS)
        self.dtype = dtype
        # Whole weights written for `weights` / `adapter` (merged), and the ones the engine holds now (None: the
        # weights it was started from).
        self._weights_dir = Path(tempfile.mkdtemp(prefix="text2grad-vllm-weights-"))
        self._weights_written = 0
        self._latest_weights: dict[str, Path] = {}
        self._held: Path | None = None
        self.weight_swaps = 0  # how many times the engine's weights were replaced in place

    # ---------------------------------------------------------------------------------------------

    def set_worker_spin(self, seconds: float) -> int:
        """How long the engine's worker busy-waits for its next message after one (vLLM: 1 s) before it sleeps
        until pinged; returns how many queue readers it set (0 where vLLM's internals differ: nothing changes)."""
        try:
            return int(self.llm.collective_rpc(_set_idle_spin, args=(seconds,))[0])
        except Exception as exc:  # a speed setting: never a reason for the engine to fail
            logger.warning("could not set the vLLM worker's idle spin (%s); it keeps vLLM's own", exc)
            return 0

    @property
    def serves_lora_requests(self) -> bool:
        """True when adapters are served as vLLM LoRA requests, False when they are merged into whole weights."""
        return self.max_lora_rank is not None

    def adapter(self, adapter_dir: str | Path, name: str | None = None):
        """What `generate` needs (``weights``) to serve the peft adapter saved in ``adapter_dir``: a new
        `vllm.lora.request.LoRARequest` on an engine with LoRA slots, else the adapter merged into the engine's
        base weights on the host (`EngineWeights`).

        Every call gets a new LoRA id, so an adapter saved again into a new folder (PPO's policy after an update)
        is loaded afresh instead of served from vLLM's adapter cache.
        """
        if not self.serves_lora_requests:
            base = load_causal_lm(self.model_path, adapter=str(adapter_dir), dtype=self.dtype)
            weights = merged_weights(base)
            del base
            return self.weights(weights, name or f"adapter-{Path(adapter_dir).name}")
        from vllm.lora.request import LoRARequest

        lora_id, self._next_lora_id = self._next_lora_id, self._next_lora_id + 1
        return LoRARequest(name or f"adapter-{lora_id}", lora_id, str(adapter_dir))

    def weights(self, state_dict: dict[str, torch.Tensor], name: str) -> EngineWeights:
        """Register whole weights (under the base checkpoint's names, same architecture and shapes) for `generate`
        to serve: written to disk now and loaded into the engine in place when a request names them. A later call
        with the same ``name`` replaces these (the earlier handle must not be used again)."""
        self._weights_written += 1
        folder = self._weights_dir / f"{name}-{self._weights_written}"
        folder.mkdir(parents=True)
        save_file({key: tensor.contiguous() for key, tensor in state_dict.items()}, str(folder / "model.safetensors"))
        earlier = self._latest_weights.get(name)
        if earlier is not None and earlier != self._held:
            shutil.rmtree(earlier, ignore_errors=True)  # (the held one goes when the engine loads others)
        self._latest_weights[name] = folder
        return EngineWeights(name, folder)

    def hold(self, weights: EngineWeights | None) -> None:
        """Make the engine hold ``weights`` (None: the weights it was started from), loading them in place if it
        holds others."""
        folder = None if weights is None else weights.folder
        if folder == self._held:
            return
        if folder is not None and not folder.is_dir():
            raise ValueError(f"the engine weights {weights.name!r} were replaced by a later call to weights() with "
                             "the same name; use the newer handle")
        self._load_in_place(folder or self.model_path)
        replaced, self._held = self._held, folder
        if replaced is not None and replaced not in self._latest_weights.values():
            shutil.rmtree(replaced, ignore_errors=True)  # superseded while held: nothing can ask for it again

    def _load_in_place(self, model_dir: str | Path) -> None:
        """Load the safetensors weights in ``model_dir`` into the running engine and drop its KV cache of earlier
        prompts, so no output is computed from the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir)})
        self.weight_swaps += 1
        # vLLM's in-place reload refills the input embeddings but leaves a tied output layer (lm_head) on its old
        # tensor (measured on SmolLM2: sampled-token log-probs off by 0.2-0.4 nats); tie it again.
        self.llm.apply_model(_retie_output_embeddings)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("the vLLM engine could not drop its prefix cache after loading new weights (requests "
                               "still running?); outputs would mix old and new weights")

    def generate(
        self,
        tokenizer,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_strings: Sequence[str] | None = None,
        weights=None,
        logprobs: bool = False,
        seed: int | None = None,
        constraints: Sequence[dict[str, Any] | None] | None = None,
        progress_bar: bool = False,
    ) -> list[Generation]:
        """One `Generation` per prompt (token ids), in order, cut like `text2grad.core.generation.generate` cuts
        (first EOS kept, stop strings). With ``logprobs`` each row's ``sampled_logprobs`` holds vLLM's
        log-probability of each sampled token (after temperature/top-k/top-p). ``weights``: what serves the prompts:
        None (the weights the engine was started from), or what `adapter` or `weights` returned (a LoRA request,
        or whole weights the engine loads in place first when it holds others). ``seed`` makes sampling reproducible (row i uses ``seed + i``); on CPU,
        vLLM 0.32 fails a seeded request whose prompt it prefills in chunks ("CPU Generator does not use offset"),
        which happens once a batch's prompts exceed the engine's per-step token budget, so seed only small batches.
        ``constraints``: per prompt, a `request_constraint` (or None) that constrains that row's logits, as a
        transformers logits processor would (the reward model's grounded span decoding is one)."""
        from vllm import SamplingParams

        settings = dict(
            temperature=temperature if do_sample else 0.0,
            top_p=top_p if do_sample else 1.0,
            top_k=top_k if do_sample and top_k > 0 else 0,
            max_tokens=max_new_tokens,
            stop=list(stop_strings) if stop_strings else None,
            include_stop_str_in_output=True,
            skip_special_tokens=True,
            logprobs=0 if logprobs else None,
        )
        if constraints is not None and len(constraints) != len(prompt_ids):
            raise ValueError(f"got {len(constraints)} constraints for {len(prompt_ids)} prompts; pass one (or None) per prompt")
        # one seed per row (seed + row): the same prompt twice in a batch still gets two different samples
        seeds = [None if seed is None else seed + row for row in range(len(prompt_ids))]
        extra_args = [dict(c) if c else None for c in constraints] if constraints is not None else [None] * len(prompt_ids)
        params = (SamplingParams(**settings) if seed is None and constraints is None
                  else [SamplingParams(**settings, seed=s, extra_args=e) for s, e in zip(seeds, extra_args)])
        requests = [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_ids]
        lora = weights if weights is not None and not isinstance(weights, EngineWeights) else None
        self.hold(weights if isinstance(weights, EngineWeights) else None)  # LoRA requests sit on the base weights
        outputs = self.llm.generate(requests, params, lora_request=lora, use_tqdm=progress_bar)
        rows = []
        for out in outputs:
            sample = out.outputs[0]
            # the prompt ids as the engine read them (it adds nothing to token-id prompts: no second BOS)
            row = finish_generation(tokenizer, list(out.prompt_token_ids), list(sample.token_ids), self._eos_ids, stop_strings)
            if logprobs and sample.logprobs is not None:
                row.sampled_logprobs = [
                    float(step[token].logprob) for step, token in zip(sample.logprobs, row.response_ids)
                ]
            rows.append(row)
        return rows

    def close(self) -> None:
        """Stop the engine's processes and free its memory (and the whole weights written for it)."""
        if getattr(self, "_weights_dir", None) is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
        reaper, self._reaper = getattr(self, "_reaper", None), None
        if reaper is not None:
            reaper.release()


# The reaper's whole program (run as ``python -c``, engine pids as arguments). It ignores Ctrl-C and SIGTERM sent to
# the process group: the owner handles those and closes its engine. It reads its stdin to the end: "release" means
# the owner closed the engine; end of file without it means the owner died, and the engine's processes are ended
# (SIGTERM, SIGKILL 10 s later). psutil refuses to signal a pid that another process has taken since.
_REAPER_PROGRAM = """
import signal, sys
import psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
procs = []
for pid in sys.argv[1:]:
    try:
        procs.append(psutil.Process(int(pid)))
    except psutil.NoSuchProcess:
        pass
if sys.stdin.buffer.read() != b"release":
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.wait_procs(procs, timeout=10)[1]:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
"""


class EngineReaper:
    """A small process that ends an engine's processes if the process that started the engine dies without closing
    it. `release` (from `VLLMEngine.close`) lets it go without touching them."""

    def __init__(self, process: subprocess.Popen, pids: Sequence[int]):
        self.process, self.pids = process, tuple(pids)

    @staticmethod
    def descendants() -> set[int]:
        """The pids of this process's descendants, multiprocessing's resource trackers left out (each exits by
        itself once the processes it serves are gone, and cleans up after them)."""
        found = set()
        for proc in psutil.Process().children(recursive=True):
            try:
                if "resource_tracker" not in " ".join(proc.cmdline()):
                    found.add(proc.pid)
            except psutil.Error:  # gone meanwhile, or not ours to read
                pass
        return found

    @classmethod
    def start(cls, pids: set[int]) -> EngineReaper | None:
        """A reaper for ``pids``, or None when there is nothing to watch."""
        if not pids:
            return None
        process = subprocess.Popen([sys.executable, "-c", _REAPER_PROGRAM, *map(str, sorted(pids))],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        return cls(process, sorted(pids))

    def release(self) -> None:
        """The engine was closed: the reaper exits and leaves its processes alone."""
        try:
            self.process.stdin.write(b"release")
            self.process.stdin.close()
        except (BrokenPipeError, ValueError):  # the reaper is gone already (or was released)
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def place_engine(gpu_memory_utilization: float | None, cpu_kv_cache_gb: float) -> EnginePlacement:
    """This process's engine placement (`text2grad.core.placement.engine_placement`) from the launcher's
    environment, the visible GPUs and this process's CPU cores. ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, is the
    machine's KV-cache budget instead of ``cpu_kv_cache_gb``; a ``VLLM_CPU_OMP_THREADS_BIND`` set by the user is
    left to vLLM."""
    budget = os.environ.get(_CPU_KV_CACHE_ENV)
    if budget:
        try:
            cpu_kv_cache_gb = float(budget)
        except ValueError:
            raise ValueError(f"{_CPU_KV_CACHE_ENV} must be a number of GiB, got {budget!r}") from None
    user_bound = bool(os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
    cores = () if user_bound or not hasattr(os, "sched_getaffinity") else sorted(os.sched_getaffinity(0))
    return engine_placement(local_rank() or 0, local_world_size(), visible_gpus(), gpu_memory_utilization,
                            cpu_kv_cache_gb, cores)


@contextmanager
def _environment(changes: dict[str, str | None]) -> Iterator[None]:
    """Hold ``changes`` (None: unset) in ``os.environ`` for the duration, then put every variable back."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _set_idle_spin(worker, seconds: float) -> int:
    """Runs inside the engine's worker process (`VLLMEngine.set_worker_spin`): its shared-memory queue readers
    busy-wait ``seconds`` for the next message before they sleep on the socket that the writer pings with every
    message, so a short spin loses nothing but a wake-up between messages further apart. Returns how many readers
    it set."""
    from vllm.distributed.device_communicators import shm_broadcast

    condition = getattr(shm_broadcast, "SpinCondition", None)
    if condition is None:
        return 0
    # type(), not isinstance(): isinstance reads __class__, which fails on a dead weak proxy among the live objects
    readers = [o for o in gc.get_objects() if issubclass(type(o), condition) and getattr(o, "is_reader", False)]
    for reader in readers:
        reader.busy_loop_s = seconds
    return len(readers)


def _retie_output_embeddings(model: torch.nn.Module) -> bool:
    """Runs inside the engine's worker after a weight reload: a model with tied input and output embeddings gets
    its output layer pointed at the reloaded input embeddings again (and its CPU matmul set up anew). True if it
    re-tied something."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if not (getattr(config, "tie_word_embeddings", False) and lm_head is not None and embed is not None):
        return False
    lm_head.weight = embed.weight
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)
    return True


def _vllm_dtype(dtype: str | None) -> str:
    torch_dtype = resolve_dtype(dtype)  # vLLM wants torch's names ("bfloat16"), not the short "bf16"
    return "auto" if torch_dtype is None else str(torch_dtype).removeprefix("torch.")


def _eos_token_ids(model_path: str, tokenizer) -> list[int]:
    """The ids vLLM stops at: the model's generation config's EOS ids plus the tokenizer's EOS."""
    ids: list[int] = []
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    except (OSError, ValueError):
        pass
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


# ---------------------------------------------------------------------------------------------------
# One engine per process
# ---------------------------------------------------------------------------------------------------

_shared: tuple[EngineKey, VLLMEngine] | None = None


def shared_engine(
    model: str | Path,
    *,
    tokenizer: str | Path | None = None,
    dtype: str | None = "auto",
    max_lora_rank: int | None = None,
    lora_mode: LoraMode = "auto",
    **options: Any,
) -> VLLMEngine:
    """This process's engine for ``model``: the running one when it was started with the same arguments (and, when
    it serves LoRA requests, a LoRA slot at least as large), or a new one when none runs. ``lora_mode`` (see the
    module docstring; "auto": "adapter" on a GPU, "merged" on a CPU) decides whether adapters up to
    ``max_lora_rank`` are served as LoRA requests or merged. One engine at a time (its memory is reserved up
    front): asking for a different one while one runs is an error that names the difference; call
    `close_shared_engine` first to switch on purpose."""
    global _shared
    try:
        import vllm  # noqa: F401  (first: without vllm, no other answer matters)
    except ImportError as exc:
        raise ImportError(vllm_missing_message("the vLLM generation engine")) from exc
    mode = resolve_lora_mode(lora_mode)
    key = EngineKey(str(model), str(tokenizer or model), _vllm_dtype(dtype), None, tuple(sorted(options.items())), mode)
    if _shared is not None:
        old_key, engine = _shared
        differences = [
            f"{name} {getattr(key, name)!r} (running: {getattr(old_key, name)!r})"
            for name in ("model", "tokenizer", "dtype", "options", "lora_mode") if getattr(key, name) != getattr(old_key, name)
        ]
        if mode == old_key.lora_mode == "adapter" and max_lora_rank is not None and (
                old_key.max_lora_rank is None or lora_rank_slot(max_lora_rank) > old_key.max_lora_rank):
            differences.append(f"LoRA rank {max_lora_rank} (running engine's LoRA slot: {old_key.max_lora_rank})")
        if not differences:
            return engine
        raise ValueError(
            "a vLLM engine with other settings already runs in this process (one engine at a time): asked for "
            + "; ".join(differences) + ". Give the policy and the reward model the same base model, tokenizer, dtype, "
            "lora_mode and vLLM options (LoRA ranks up to 16 share a slot), or use backend 'hf' for one of them."
        )
    slot = lora_rank_slot(max_lora_rank) if max_lora_rank is not None and mode == "adapter" else None
    engine = VLLMEngine(model, tokenizer=tokenizer, dtype=dtype, max_lora_rank=slot, **options)
    _shared = (EngineKey(key.model, key.tokenizer, key.dtype, slot, key.options, mode), engine)
    return engine


def close_shared_engine() -> None:
    """Stop this process's shared engine, if one runs."""
    global _shared
    if _shared is not None:
        _shared[1].close()
        _shared = None
