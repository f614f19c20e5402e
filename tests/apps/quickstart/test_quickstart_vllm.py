"""The quickstart's generation backend: the smollm2 preset samples PPO's rollouts and writes the reward model's
critiques with vLLM where it is installed, and hands the reward model the settings under which the policy's engine
serves it too (one engine per PPO process)."""

from __future__ import annotations

import json

import pytest
from tests.apps.quickstart.test_quickstart_chat_template import _flag, _RecordedPhases
from tests.vllm_testlib import make_smollm2_lora_adapter
from transformers import AutoTokenizer

import text2grad.apps.quickstart.presets as presets
import text2grad.core.vllm_engine as vllm_engine
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.vllm_rollouts import VLLMRollouts
from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart import pipeline
from text2grad.apps.quickstart.presets import resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.core.assets import smollm2_path
from text2grad.core.config import parse_config


@pytest.mark.parametrize("installed", [True, False], ids=["vllm", "no-vllm"])
def test_smollm2_samples_with_vllm_where_installed_and_the_tiny_presets_with_transformers(monkeypatch, installed):
    monkeypatch.setattr(presets, "vllm_available", lambda: installed)
    assert resolve(QuickstartConfig(preset="smollm2")).generation_backend == ("vllm" if installed else "hf")
    assert resolve(QuickstartConfig(preset="smollm2", generation_backend="hf")).generation_backend == "hf"
    for preset in ("ci", "default", "large"):
        assert resolve(QuickstartConfig(preset=preset)).generation_backend == "hf"
    if not installed:
        with pytest.raises(ValueError, match="needs the vllm package.*TEXT2GRAD_EXTRAS"):
            resolve(QuickstartConfig(preset="smollm2", generation_backend="vllm"))


class _EngineStarts:
    """Stands in for `text2grad.core.vllm_engine.VLLMEngine` (whose start takes half a minute): counts the engines
    `shared_engine` starts and hands out merged weights as the real one does on a CPU."""

    started: list[dict] = []

    def __init__(self, model, **settings):
        self.started.append({"model": str(model), **settings})
        self.max_lora_rank = settings.get("max_lora_rank")

    serves_lora_requests = False

    def adapter(self, adapter_dir, name=None):
        return vllm_engine.EngineWeights(name or "adapter", adapter_dir)


def test_the_reward_model_shares_the_policys_engine_in_the_ppo_command(tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "vllm_available", lambda: True)
    calls = _RecordedPhases()
    monkeypatch.setattr(pipeline, "_call", calls)
    cfg = resolve(QuickstartConfig(preset="smollm2", generation_backend="vllm", output_dir=str(tmp_path / "out"),
                                   ppo_iterations=1, eval_every=1))
    data = pipeline.stage_data(cfg, tmp_path / "out")
    policy = smollm2_path()
    reward_model = make_smollm2_lora_adapter(tmp_path / "rm", seed=0)
    pipeline.stage_ppo(cfg, data, policy, reward_model, tmp_path / "out", "nl_gradient",
                       lambda path, records: ({"fact_score": 0.0}, []))
    (argv,) = calls.argv["policy_optimization.train"]
    assert _flag(argv, "--generation_backend") == "vllm"
    critic_kwargs = json.loads(_flag(argv, "--critic_kwargs"))
    assert critic_kwargs["backend"] == "vllm" and critic_kwargs["grounded_spans"] is cfg.grounded_spans

    # What the PPO process does with those flags: its rollouts' engine, then the critic's; one engine starts.
    pytest.importorskip("vllm", reason="vllm is not importable (install the 'vllm' extra: see env.sh)")
    monkeypatch.setattr(vllm_engine, "_shared", None)  # this process's real engine (other tests) is left alone
    monkeypatch.setattr(vllm_engine, "VLLMEngine", _EngineStarts)
    monkeypatch.setattr(_EngineStarts, "started", [])
    ppo = parse_config(PPOConfig, argv)
    assert ppo.use_lora  # the preset's LoRA policy
    rollouts = VLLMRollouts(ppo, AutoTokenizer.from_pretrained(str(policy)), ppo.model_name_or_path, ppo.lora_r)
    engine = rollouts.engine
    critic = GenerativeRewardModel.from_critic_kwargs(**critic_kwargs)
    assert critic.engine.engine is engine and len(_EngineStarts.started) == 1, _EngineStarts.started
    assert _EngineStarts.started[0]["model"] == str(policy)
    rollouts.close()
