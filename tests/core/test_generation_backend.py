"""`text2grad.core.generation_backend` without an engine: where a model's parts come from, and the clear refusal when
vllm is asked for but not importable (before any model loads). The commands that use it, and the real-engine
comparisons of the two backends, are tested in tests/apps/evaluation/test_vllm_generation.py and
tests/apps/test_prepare_data_vllm.py."""

from __future__ import annotations

import json

import pytest

from text2grad.core import generation_backend
from text2grad.core.generation_backend import TextGenerator, load_text_generator, resolve_model_source


def _adapter_dir(path, base: str | None, rank: int = 4, tokenizer: bool = False):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": rank,
        "lora_alpha": 8, "target_modules": ["q_proj"],
    }))
    if tokenizer:
        (path / "tokenizer_config.json").write_text("{}")
    return path


def test_model_sources_as_users_name_them(tmp_path):
    assert resolve_model_source("org/model") == generation_backend.ModelSource("org/model", None, "org/model")
    only = _adapter_dir(tmp_path / "only", base="org/base")
    assert resolve_model_source(str(only)) == generation_backend.ModelSource("org/base", str(only), "org/base")
    with_tokenizer = _adapter_dir(tmp_path / "tok", base="org/base", tokenizer=True)
    source = resolve_model_source("org/base", str(with_tokenizer))
    assert (source.base, source.adapter, source.tokenizer) == ("org/base", str(with_tokenizer), str(with_tokenizer))
    assert generation_backend._adapter_rank(str(with_tokenizer)) == 4
    with pytest.raises(ValueError, match="names no base model"):
        resolve_model_source(str(_adapter_dir(tmp_path / "orphan", base=None)))


def test_missing_vllm_is_refused_before_anything_loads(monkeypatch, tmp_path):
    monkeypatch.setattr(generation_backend, "vllm_available", lambda: False)
    with pytest.raises(ImportError, match=r"generation_backend 'vllm' needs the vllm package.*TEXT2GRAD_EXTRAS"):
        load_text_generator("vllm", str(tmp_path / "no-such-model"))  # not an OSError: checked first
    with pytest.raises(ValueError, match="must be one of hf, vllm"):
        load_text_generator("tgi", "org/model")
    with pytest.raises(ValueError, match="exactly one of model"):
        TextGenerator(tokenizer=None)
