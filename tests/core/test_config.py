"""Config precedence (defaults < YAML < CLI), typing and error messages."""

from dataclasses import dataclass
from typing import Literal

import pytest

from text2grad.core.config import ConfigError, config_field, literal_choices, load_config, parse_config, save_config


@dataclass
class DemoConfig:
    model: str = config_field("meta-llama/Llama-3.1-8B-Instruct", "base model")
    lr: float = config_field(1e-6, "learning rate")
    steps: int = config_field(10, "steps")
    use_lora: bool = config_field(True, "train a LoRA adapter")
    mode: Literal["nl_gradient", "scalar"] = config_field("nl_gradient", "reward mode")
    targets: list[str] = config_field(["q_proj", "v_proj"], "LoRA targets")
    adapter: str | None = config_field(None, "adapter dir")
    kwargs: dict = config_field({}, "extra")


def test_precedence(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("lr: 2.0e-5\nsteps: 50\nuse_lora: false\ntargets: [a, b, c]\nkwargs: {x: 1}\n")
    cfg = parse_config(DemoConfig, ["--config", str(yaml_file), "--steps", "7", "--mode", "scalar", "--adapter", "none"])
    assert cfg.lr == 2e-5 and cfg.steps == 7 and cfg.use_lora is False and cfg.mode == "scalar"
    assert cfg.targets == ["a", "b", "c"] and cfg.kwargs == {"x": 1} and cfg.adapter is None
    assert cfg.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_cli_lists_dicts_and_dashes():
    cfg = parse_config(DemoConfig, ["--targets", "x,y", "--kwargs", '{"a": 2}', "--use-lora", "no", "--lr", "3e-4"])
    assert cfg.targets == ["x", "y"] and cfg.kwargs == {"a": 2} and cfg.use_lora is False and cfg.lr == 3e-4


def test_unknown_yaml_key_names_it(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("learning_rate: 1\n")
    with pytest.raises(ConfigError, match="learning_rate.*Valid keys"):
        load_config(DemoConfig, p)


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="'steps'"):
        load_config(DemoConfig, overrides={"steps": "many"})
    with pytest.raises(ConfigError, match="'mode'"):
        load_config(DemoConfig, overrides={"mode": "dense"})
    with pytest.raises(ConfigError, match="'use_lora'"):
        load_config(DemoConfig, overrides={"use_lora": "maybe"})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(DemoConfig, tmp_path / "missing.yaml")


def test_cli_error_exits_with_message(capsys):
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, ["--steps", "1.5"])
    assert "steps" in capsys.readouterr().err


def test_help_lists_fields(capsys):
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, ["--help"])
    out = capsys.readouterr().out
    assert "--lr" in out and "learning rate" in out and "Choices: nl_gradient, scalar" in out


def test_save_and_reload(tmp_path):
    cfg = DemoConfig(steps=3, targets=["k"])
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(DemoConfig, tmp_path / "saved.yaml") == cfg


def test_literal_choices_lists_each_literal_field_and_none_when_optional():
    @dataclass
    class Cfg:
        mode: Literal["a", "b"] = "a"
        maybe: Literal["x"] | None = None
        name: str = "n"

    assert literal_choices(Cfg) == {"mode": ("a", "b"), "maybe": ("x", None)}
