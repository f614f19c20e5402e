"""What only a GPU can show: PPO in bf16 on CUDA (also under DeepSpeed ZeRO-2), each process's reward models on
``cuda:<LOCAL_RANK>``, the vLLM engine on its process's GPU, and two processes on two GPUs.

Every test here is marked ``gpu``: it runs where CUDA is visible and is skipped, with the reason, elsewhere
(tests/conftest.py). ``pytest -m gpu`` runs them alone (``scripts/gpu_check.sh`` does). The CPU-side logic they
rest on (which device each rank gets, what is refused) is tested without a GPU in tests/core/test_placement.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from policy_optimization.models import ValueModel
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel
from reward_model.scalar import ScalarRewardScorer
from reward_model.scalar_config import ScalarRMConfig
from tests.policy_optimization.po_testlib import PROMPTS, TINY_PPO, first_and_last_words
from tests.policy_optimization.test_multiprocess import placements, ppo_flags, with_free_port, world  # noqa: F401 (fixture)
from tests.policy_optimization.test_training_scripts import ROOT, read_metrics, script_env
from tests.vllm_testlib import engine_for_tests
from text2grad.core.assets import AssetMissingError, smollm2_path
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.modeling import build_tiny_llama
from text2grad.core.placement import process_device
from text2grad.core.vllm_engine import vllm_available

pytestmark = pytest.mark.gpu


def run_or_fail(cmd: list[str], env: dict[str, str], timeout_s: float = 240) -> subprocess.CompletedProcess:
    """``cmd`` from the repository root; a launch that hangs fails the test with what it printed so far."""
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        printed = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"no result within {timeout_s:.0f} s; its stderr so far:\n{printed[-6000:]}")


@pytest.fixture
def fresh_accelerate_state():
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def last_rank(monkeypatch) -> int:
    """This process posing as the last rank of a launch with one process per visible GPU."""
    count = torch.cuda.device_count()
    for name, value in {"LOCAL_RANK": str(count - 1), "LOCAL_WORLD_SIZE": str(count), "WORLD_SIZE": str(count)}.items():
        monkeypatch.setenv(name, value)
    return count - 1


def test_a_ppo_iteration_in_bf16_on_cuda(bpe_tokenizer, tmp_path, monkeypatch, fresh_accelerate_state):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cfg = PPOConfig(**{**TINY_PPO, "num_iterations": 1, "output_dir": str(tmp_path / "run")})
    policy = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    value = ValueModel.from_causal_lm(build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=1))
    trainer = NLGradientPPOTrainer(cfg, bpe_tokenizer, policy, None, value,
                                   CallableFeedbackSource(first_and_last_words), [{"prompt": p} for p in PROMPTS])
    assert trainer.accelerator.device.type == "cuda" and trainer.accelerator.mixed_precision == "bf16"
    assert {p.device.type for p in trainer.accelerator.unwrap_model(trainer.model).parameters()} == {"cuda"}
    metrics = trainer.step()
    assert metrics["objective/kl"] == pytest.approx(0.0, abs=1e-3)  # LoRA B starts at zero: policy == reference
    for key in ("loss/policy", "loss/value", "reward/total_mean", "policy/entropy"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert torch.cuda.max_memory_allocated() > 0


def test_both_reward_models_go_on_cuda_of_the_local_rank(bpe_tokenizer, tmp_path, last_rank):
    own = torch.device("cuda", last_rank)
    assert process_device() == own
    build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)
    critic = GenerativeRewardModel.from_critic_kwargs(path=str(tmp_path), max_new_tokens=4)
    assert critic.device == own and {p.device for p in critic.model.parameters()} == {own}
    assert len(critic.feedback(["a prompt"], ["a response"])) == 1  # generation runs on that GPU

    scalar = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=1)
    scalar.config.pad_token_id = bpe_tokenizer.pad_token_id
    scorer = ScalarRewardScorer(model=scalar, tokenizer=bpe_tokenizer, config=ScalarRMConfig(model_name_or_path=str(tmp_path)))
    assert scorer.device == own and {p.device for p in scorer.model.parameters()} == {own}
    scores = scorer(["a prompt", "another"], ["a response", "another response"])
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)


def test_the_vllm_engine_starts_on_this_process_gpu():
    if not vllm_available():
        pytest.skip("vllm is not importable (install the 'vllm' extra: see env.sh)")
    try:
        engine = engine_for_tests()
    except AssetMissingError as exc:  # the real-asset packages are an optional extra
        pytest.skip(f"the SmolLM2 asset is not installed: {exc}")
    assert engine.placement.gpu_index == 0 and engine.placement.cpu_kv_cache_bytes is None
    assert engine.placement.describe().startswith("cuda:0 (physical GPU")
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_path()))
    generation = engine.generate(tokenizer, [tokenizer.encode("The capital of France is")], max_new_tokens=4)[0]
    assert 1 <= len(generation.response_ids) <= 4


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_on_two_gpus_each_train_on_their_own(world, tmp_path):  # noqa: F811 (the fixture)
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, this machine shows {torch.cuda.device_count()}")
    out = tmp_path / "run"
    flags = ppo_flags(world, out, "--critic", "reward_model",
                      "--critic_kwargs", json.dumps({"path": str(world / "model"), "max_new_tokens": 8}),
                      "--reward_mode", "mixed", "--scalar_source", "scalar_rm",
                      "--scalar_source_kwargs", json.dumps({"path": str(world / "scalar_rm")}),
                      "--feedback_prompt_template", "{prompt}", "--max_feedback_error_rate", "1.0", "--save_steps", "0",
                      "--real_devices")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "-m", "tests.policy_optimization.multiprocess_worker", *flags]
    env = script_env(tmp_path, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="0,1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for rank, seen in enumerate(placements(out)):
        assert seen["accelerator_device"] == seen["critic"] == seen["scalar_reward_model"] == f"cuda:{rank}"
        assert seen["policy"] == seen["value"] == [f"cuda:{rank}"]
    assert [m["iteration"] for m in read_metrics(out)] == [1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero2_ppo_on_one_gpu_in_bf16(world, tmp_path):  # noqa: F811 (the fixture)
    """The GPU launch config users start from (configs/accelerate/deepspeed_zero2.yaml), cut to one process."""
    out = tmp_path / "run"
    flags = ppo_flags(world, out, "--critic", "reference", "--critic_kwargs", '{"reference_field": "reference"}',
                      "--save_steps", "0", "--real_devices")
    launcher = with_free_port(["accelerate.commands.launch", "--config_file",
                               str(ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"), "--num_processes", "1"])
    cmd = [sys.executable, "-m", *launcher, "-m", "tests.policy_optimization.multiprocess_worker", *flags]
    env = script_env(tmp_path, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="0")
    proc = run_or_fail(cmd, env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    seen = json.loads((out / "placement-rank0.json").read_text())
    assert (seen["accelerator_device"], seen["zero_stage"], seen["mixed_precision"]) == ("cuda:0", 2, "bf16")
    assert seen["policy"] == seen["value"] == ["cuda:0"]
    [metrics] = read_metrics(out)
    for key in ("loss/policy", "loss/value", "objective/kl"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
