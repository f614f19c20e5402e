"""Every trainer's config takes its model and LoRA fields from the one `ModelConfig`, with the defaults each
trainer had before the fields were shared (written out by hand here, so a changed default fails)."""

from __future__ import annotations

import dataclasses

import pytest

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.dpo_config import DPORunConfig
from policy_optimization.grpo_config import GRPORunConfig
from policy_optimization.sft_config import SFTRunConfig
from reward_model.scalar_config import ScalarRMConfig
from reward_model.train_config import RewardModelConfig
from text2grad.core.config import build_parser, parse_config
from text2grad.core.model_config import ModelConfig

LLAMA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHARED = ("model_name_or_path", "tokenizer_name_or_path", "dtype", "use_lora", "lora_r", "lora_alpha", "lora_dropout",
          "lora_target_modules")

# (model_name_or_path, tokenizer, dtype, use_lora, r, alpha, dropout, target modules), as before the refactor
DEFAULTS = {
    PPOConfig: ("", None, "auto", True, 16, 32, 0.0, ["all-linear"]),
    GRPORunConfig: ("", None, "auto", True, 16, 32, 0.0, ["all-linear"]),
    SFTRunConfig: ("", None, "auto", True, 16, 32, 0.05, ["all-linear"]),
    DPORunConfig: ("", None, "auto", True, 16, 32, 0.05, ["all-linear"]),
    RewardModelConfig: ("meta-llama/Llama-3.1-8B-Instruct", None, "auto", True, 16, 32, 0.05, LLAMA),
    ScalarRMConfig: ("", None, "auto", True, 16, 32, 0.05, LLAMA),
}


@pytest.mark.parametrize("cls", DEFAULTS, ids=lambda c: c.__name__)
def test_trainer_configs_share_the_model_fields_with_their_old_defaults(cls):
    assert issubclass(cls, ModelConfig)
    cfg = cls()
    assert tuple(getattr(cfg, name) for name in SHARED) == DEFAULTS[cls]
    # the list default is copied per instance, never shared between configs
    assert cfg.lora_target_modules is not cls().lora_target_modules


@pytest.mark.parametrize("cls", DEFAULTS, ids=lambda c: c.__name__)
def test_the_shared_fields_parse_and_show_in_help_under_models_and_lora(cls):
    cfg = parse_config(cls, ["--lora_r", "8", "--lora_target_modules", "q_proj,v_proj", "--dtype", "fp32",
                             "--model_name_or_path", "m"])
    assert (cfg.lora_r, cfg.lora_target_modules, cfg.dtype, cfg.model_name_or_path) == (8, ["q_proj", "v_proj"], "fp32", "m")
    help_text = build_parser(cls).format_help()
    models, lora = help_text.index("\nmodels:\n"), help_text.index("\nLoRA:\n")
    assert models < help_text.index("--model_name_or_path") and lora < help_text.index("--lora_alpha")
    assert "LoRA rank." in help_text


def test_each_shared_field_is_declared_once_outside_the_base():
    """A trainer redeclares a shared field only to change its default (and says so in its help)."""
    redeclared = {
        cls.__name__: sorted(name for name in SHARED if name in cls.__dict__.get("__annotations__", {}))
        for cls in (PPOConfig, GRPORunConfig, SFTRunConfig.__mro__[1], RewardModelConfig, ScalarRMConfig)
    }
    assert redeclared == {
        "PPOConfig": ["lora_dropout"], "GRPORunConfig": ["lora_dropout"], "HFRunConfig": [],
        "RewardModelConfig": ["lora_target_modules", "model_name_or_path"], "ScalarRMConfig": ["lora_target_modules"],
    }
    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(SHARED)
