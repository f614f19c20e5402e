"""``text2grad serve-critic`` without starting vLLM: the server's command line and environment, the critic settings
it prints, the refusal to listen beyond localhost without a key, and the stop that ends the server's whole process
group. The real server is started once per pytest run (tests/critic_server.py) and used in
tests/test_critics_behind_a_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from reward_model import serve
from reward_model.serve import (
    CriticServer, ServedModel, _end_group, critic_settings, main, prepare_model, server_command, server_environment,
)
from reward_model.serve_config import ServeCriticConfig
from text2grad.core.config import ConfigError
from text2grad.core.vllm_engine import REQUEST_LOGITS_PROCESSOR


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_the_server_is_started_through_the_module_with_the_projects_logits_processor():
    cfg = ServeCriticConfig(reward_model="rm", served_model_name="critic", port=9000, dtype="float32", max_model_len=2048)
    cmd = server_command(cfg, ServedModel("/models/merged"), 9000)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert (_value(cmd, "--model"), _value(cmd, "--served-model-name"), _value(cmd, "--port")) == ("/models/merged", "critic", "9000")
    assert _value(cmd, "--logits-processors") == REQUEST_LOGITS_PROCESSOR
    assert _value(cmd, "--generation-config") == "vllm" and _value(cmd, "--max-model-len") == "2048"
    assert "--enable-lora" not in cmd and "--api-key" not in cmd
    assert "--enforce-eager" in cmd and "--enforce-eager" not in server_command(cfg, ServedModel("m"), 9000, on_gpu=True)


def test_a_lora_adapter_is_served_under_the_critics_name_on_its_base():
    cfg = ServeCriticConfig(reward_model="rm", served_model_name="critic", vllm_args=["--tensor-parallel-size", "2"])
    cmd = server_command(cfg, ServedModel("base-model", tokenizer="/rm", adapter="/rm", adapter_rank=8), 8000)
    assert "--enable-lora" in cmd and _value(cmd, "--lora-modules") == "critic=/rm"
    assert _value(cmd, "--served-model-name") == "critic-base" and _value(cmd, "--max-lora-rank") == "16"
    assert _value(cmd, "--tokenizer") == "/rm" and cmd[-2:] == ["--tensor-parallel-size", "2"]


def test_the_key_travels_in_the_environment_and_cpu_settings_keep_the_users(monkeypatch):
    monkeypatch.setattr(serve, "visible_gpus", lambda: 0)  # the CPU engine's settings, also on a GPU machine
    cfg = ServeCriticConfig(reward_model="rm", api_key_env="MY_CRITIC_KEY", cpu_kv_cache_gb=3)
    env = server_environment(cfg, {"MY_CRITIC_KEY": "secret-key", "VLLM_API_KEY": "stale", "PYTHONPATH": "/x"})
    assert env["VLLM_API_KEY"] == "secret-key" and env["PYTHONPATH"].endswith(os.pathsep + "/x")
    assert Path(env["PYTHONPATH"].split(os.pathsep)[0], "reward_model", "serve.py").is_file()  # the project first
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_CPU_OMP_THREADS_BIND"]  # no GPU in this test process
    assert env["TORCHDYNAMO_DISABLE"] == "1"  # the CPU engine runs without torch.compile
    kept = server_environment(cfg, {"VLLM_CPU_KVCACHE_SPACE": "5", "VLLM_CPU_OMP_THREADS_BIND": "0",
                                    "TORCHDYNAMO_DISABLE": "0"})
    assert "VLLM_API_KEY" not in kept and kept["VLLM_CPU_KVCACHE_SPACE"] == "5" and kept["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert kept["TORCHDYNAMO_DISABLE"] == "0"
    monkeypatch.setattr(serve, "visible_gpus", lambda: 1)  # a GPU engine gets no CPU settings
    on_gpu = server_environment(cfg, {})
    assert "VLLM_CPU_KVCACHE_SPACE" not in on_gpu and "VLLM_CPU_OMP_THREADS_BIND" not in on_gpu
    assert "TORCHDYNAMO_DISABLE" not in on_gpu


def test_the_printed_critic_settings_build_the_remote_reward_model(monkeypatch, tmp_path):
    monkeypatch.delenv("TEXT2GRAD_CRITIC_API_KEY", raising=False)
    cfg = ServeCriticConfig(reward_model=str(tmp_path), served_model_name="critic")
    settings = critic_settings(cfg, "http://127.0.0.1:8000/v1")
    assert settings == {"critic": "reward_model", "critic_kwargs": {
        "path": str(tmp_path.resolve()), "backend": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "critic"}}
    monkeypatch.setenv("TEXT2GRAD_CRITIC_API_KEY", "k")
    assert critic_settings(cfg, "u")["critic_kwargs"]["api_key_env"] == "TEXT2GRAD_CRITIC_API_KEY"


def test_listening_beyond_localhost_needs_a_key(monkeypatch, capsys):
    monkeypatch.delenv("TEXT2GRAD_CRITIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="set an API key in the environment variable TEXT2GRAD_CRITIC_API_KEY"):
        CriticServer(ServeCriticConfig(reward_model="rm", host="0.0.0.0"))
    assert main(["--reward_model", "rm", "--host", "0.0.0.0"]) == 2
    assert "error: --host 0.0.0.0 lets other machines connect" in capsys.readouterr().err
    monkeypatch.setenv("TEXT2GRAD_CRITIC_API_KEY", "k")
    assert CriticServer(ServeCriticConfig(reward_model="rm", host="0.0.0.0")).base_url.startswith("http://127.0.0.1:")
    CriticServer(ServeCriticConfig(reward_model="rm"))  # localhost: no key needed


def test_a_missing_reward_model_is_a_usage_error(capsys, tmp_path):
    assert main(["--reward_model", str(tmp_path / "nowhere"), "--port", "0"]) == 2
    assert "is not a directory" in capsys.readouterr().err


def _lora_rm_dir(base: Path, out: Path, tokenizer) -> Path:
    """A LoRA adapter on the tiny base, saved as training saves it (adapter, tokenizer)."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def test_a_lora_reward_model_is_merged_or_served_as_an_adapter(tmp_path, rm_world, rm_tokenizer):
    rm_dir = _lora_rm_dir(rm_world / "base", tmp_path / "rm", rm_tokenizer)
    merged = prepare_model(ServeCriticConfig(reward_model=str(rm_dir), lora_mode="merged"), tmp_path / "work")
    assert merged.adapter is None and (Path(merged.model) / "config.json").is_file()
    assert Path(merged.model).is_relative_to(tmp_path / "work")
    adapter = prepare_model(ServeCriticConfig(reward_model=str(rm_dir), lora_mode="adapter"), tmp_path / "work2")
    base = json.loads((rm_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (adapter.model, adapter.adapter) == (base, str(rm_dir)) and adapter.adapter_rank
    assert not (tmp_path / "work2").exists()  # nothing is written for an adapter
    full = prepare_model(ServeCriticConfig(reward_model=str(merged.model)), tmp_path / "work3")
    assert full == ServedModel(merged.model)


def test_stopping_ends_the_servers_whole_process_group(tmp_path):
    """A parent that started a child (as vLLM's server starts its engine): both are gone after the stop."""
    child_pid = tmp_path / "child.pid"
    script = ("import subprocess, sys, time, pathlib; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"pathlib.Path({str(child_pid)!r}).write_text(str(c.pid)); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 60
    while not child_pid.exists() or not child_pid.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(child_pid.read_text())
    _end_group(parent)
    assert parent.poll() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")  # a zombie has ended
