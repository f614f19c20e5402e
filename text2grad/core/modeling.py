"""Loading and building models and tokenizers, the same way for every phase.

Real runs pass a hub id (``meta-llama/Llama-3.1-8B-Instruct``) or a local directory, optionally with a
LoRA adapter directory. Tests and the quickstart build tiny models from a `LlamaConfig` and train a
tokenizer on the fly with the ``tokenizers`` library, so nothing is downloaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Literal, Mapping

import torch
from peft import PeftConfig, PeftModel
from peft.tuners.lora import LoraLayer
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
import torch.distributed as dist

from text2grad.core.model_config import DTYPE_NAMES, dtype_problem

__all__ = [
    "resolve_dtype",
    "load_tokenizer",
    "check_model_path",
    "load_causal_lm",
    "is_adapter_only",
    "merge_first",
    "merge_adapter_folder",
    "merged_weights",
    "train_tokenizer",
    "build_tiny_llama",
    "end_distributed",
    "SPECIAL_TOKENS",
]

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def resolve_dtype(name: str | None) -> torch.dtype | None:
    """"auto" / None -> None (let transformers choose); "bf16", "bfloat16", "fp16", "float32", ... (`DTYPE_NAMES`)
    -> dtype."""
    if name in (None, "auto"):
        return None
    problem = dtype_problem(name)
    if problem:
        raise ValueError(problem)
    return getattr(torch, DTYPE_NAMES[name])


def load_tokenizer(name_or_path: str, padding_side: Literal["left", "right"] = "left", **kwargs):
    """A fast tokenizer with a pad token (EOS is reused if the model has none).

    Generation wants left padding (so every prompt ends where generation starts); training code that
    needs right padding passes ``padding_side="right"``.
    """
    _check_local_or_hub(name_or_path, "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, use_fast=True, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_causal_lm(
    name_or_path: str,
    adapter: str | None = None,
    dtype: str | None = "auto",
    merge_adapter: bool = False,
    trainable_adapter: bool = False,
    **kwargs,
):
    """Load a causal LM from a hub id or local path, optionally with a PEFT adapter on top.

    Args:
        name_or_path: base model (hub id or directory). A directory holding only an adapter
            (adapter_config.json) is also accepted: its base model is loaded from the adapter config.
        adapter: a LoRA adapter directory to apply.
        dtype: "auto", "bf16", "fp16" or "fp32".
        merge_adapter: fold the adapter into the weights (faster inference, no PEFT wrapper).
        trainable_adapter: keep the adapter trainable (to continue training it).
    """
    _check_local_or_hub(name_or_path, "model")
    path = Path(name_or_path)
    if adapter is None and is_adapter_only(path):
        adapter, name_or_path = str(path), PeftConfig.from_pretrained(str(path)).base_model_name_or_path
        if not name_or_path:
            raise ValueError(
                f"{path} holds only a LoRA adapter and its adapter_config.json names no base model; "
                "pass the base model as name_or_path and this directory as adapter="
            )
    torch_dtype = resolve_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, **({"dtype": torch_dtype} if torch_dtype is not None else {}), **kwargs
    )
    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable_adapter)
        if merge_adapter:
            model = model.merge_and_unload()
    return model


@torch.no_grad()
def is_adapter_only(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a PEFT adapter (adapter_config.json) and no model of its own."""
    path = Path(path)
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def merge_first(path: str) -> str:
    """How to turn the adapter-only folder ``path`` into a whole model another phase can start from: the
    `text2grad merge-rm` command and the --model_name_or_path to pass after it."""
    merged = f"{path.rstrip('/')}-merged"
    return (f"Merge it first (`text2grad merge-rm --adapter {path} --output_dir {merged}`) and pass "
            f"--model_name_or_path {merged}")


def merge_adapter_folder(adapter_dir: str | Path, out: str | Path) -> Path:
    """The adapter in ``adapter_dir`` folded into its base model, saved with the tokenizer to ``out`` once (a later
    call finds it there). A model that starts from an adapter-only folder (e.g. a LoRA SFT) and saves its own
    adapter needs this: that adapter would name the bare base model and reload without the first adapter."""
    out = Path(out)
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".partial")
        load_causal_lm(str(adapter_dir), merge_adapter=True).save_pretrained(tmp)
        load_tokenizer(str(adapter_dir)).save_pretrained(tmp)
        tmp.replace(out)
    return out


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model's whole weights as CPU tensors under the base checkpoint's names (``model.layers.0.self_attn.
    q_proj.weight``), each tied alias (the output layer of tied embeddings) only once. For a peft LoRA model the
    active adapter is folded in, W + scale * B @ A (peft's own ``get_delta_weight``), and ``modules_to_save``
    copies replace the modules they wrap; the model itself is not changed: nothing is merged into it and unmerged
    again, so no rounding accumulates over the many refreshes of a training run.

    Plain LoRA only: a layer with a LoRA variant (DoRA, ...) or a LoRA bias is refused, because its merged weight
    is not W + scale * B @ A.
    """
    if not isinstance(model, PeftModel):
        return _unaliased_cpu_copy(model.state_dict().items(), {})
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if adapter in module.merged_adapters or adapter not in module.scaling:
                continue  # already in the base weight, or not on this layer
            if adapter in getattr(module, "lora_variant", {}) or getattr(module, "lora_bias", {}).get(adapter):
                raise ValueError(
                    f"{name}: adapter {adapter!r} is a LoRA variant (e.g. DoRA) or has a LoRA bias, which merged "
                    "serving does not fold in; serve it as a LoRA adapter instead (vLLM lora_mode 'adapter')"
                )
            key = f"{name}.weight"
            deltas[key] = deltas.get(key, 0) + module.get_delta_weight(adapter).detach()
    active = set(getattr(model, "active_adapters", None) or [model.active_adapter])
    named: list[tuple[str, torch.Tensor]] = []
    for key, tensor in base.state_dict().items():
        parts = key.split(".")
        if any(part.startswith("lora_") for part in parts) or "original_module" in parts:
            continue
        saved = re.search(r"\.modules_to_save\.([^.]+)\.", key)
        if saved:
            if saved.group(1) not in active:
                continue
            key = key.replace(saved.group(0), ".")
        named.append((key.replace(".base_layer.", "."), tensor))
    weights = _unaliased_cpu_copy(named, deltas)
    missing = set(deltas) - set(weights)
    if missing:
        raise RuntimeError(f"LoRA deltas with no base weight to fold into: {sorted(missing)[:3]}")
    return weights


def _unaliased_cpu_copy(named: Iterable[tuple[str, torch.Tensor]], deltas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies of ``named`` tensors plus their ``deltas``, skipping a tensor that aliases an earlier one (loaders
    tie those again)."""
    weights: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in named:
        if tensor.numel() and tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        merged = tensor.detach() + deltas[key].to(tensor.dtype) if key in deltas else tensor.detach()
        weights[key] = merged.to("cpu", copy=True).contiguous()
    return weights


def _check_local_or_hub(name_or_path: str, what: str) -> None:
    """Fail early with a useful message when a path-looking name does not exist."""
    looks_local = name_or_path.startswith((".", "/", "~")) or os.sep in name_or_path.strip("/").split("/", 1)[-1]
    if looks_local and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(
            f"{what} path {name_or_path!r} does not exist. Pass a local directory saved with save_pretrained(), "
            "or a hub id such as 'meta-llama/Llama-3.1-8B-Instruct' (needs network access or a warm HF cache)."
        )


def check_model_path(name_or_path: str, what: str = "model") -> None:
    """Raise FileNotFoundError naming ``what`` ("model", "tokenizer", ...) when a path-looking name does not
    exist; CLIs call it for the model before the tokenizer, so a missing model is reported as a missing model."""
    _check_local_or_hub(name_or_path, what)


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int = 512, kind: Literal["bpe", "unigram"] = "bpe", chat_template: str | None = None
):
    """Train a small fast tokenizer on ``corpus`` and wrap it as a `PreTrainedTokenizerFast`.

    kind="bpe" is byte-level BPE (GPT-2 / Llama-3 family: leading spaces become part of tokens);
    kind="unigram" is a SentencePiece-style Unigram model with the Metaspace pre-tokenizer (Llama-2 / T5
    family: spaces become "▁"). Both give exact offset mappings.
    """
    specials = list(SPECIAL_TOKENS.values())
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    else:
        raise ValueError(f"kind must be 'bpe' or 'unigram', got {kind!r}")
    tok.train_from_iterator(list(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    wrapped.padding_side = "left"
    if chat_template:
        wrapped.chat_template = chat_template
    return wrapped


def build_tiny_llama(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
):
    """A randomly initialised Llama-architecture model sized for CPU tests and the quickstart."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def deepspeed_shm_buffer(rank: int, env: Mapping[str, str] = os.environ, shm_dir: Path = Path("/dev/shm")) -> Path:
    """Where DeepSpeed's CPU backend keeps ``rank``'s shared-memory all-reduce workspace (about 66 MB) when all ranks
    of a launch share one machine: named after the user, ``MASTER_ADDR`` and ``MASTER_PORT``. DeepSpeed never
    unlinks it, so every CPU launch would leave one per rank in memory until reboot."""
    return shm_dir / f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}_{rank}"


def end_distributed() -> None:
    """Leave the process group cleanly at the end of a launched run (no-op in a single process).

    Every rank waits for the others, then the group is destroyed before the interpreter exits: a gloo group
    left alive can abort a rank during shutdown ("terminate called without an active exception", SIGABRT),
    which fails the whole launch after the work is done and saved. Each rank then removes its DeepSpeed
    shared-memory workspace (`deepspeed_shm_buffer`): after the barrier every rank has long mapped the others', and
    a mapping outlives the unlinked name.
    """
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        dist.barrier()
        dist.destroy_process_group()
        deepspeed_shm_buffer(rank).unlink(missing_ok=True)
