"""Two-process DeepSpeed PPO on CPU: ZeRO-2 through the SLF5K script's DeepSpeed variant, ZeRO-3 through the
CLI with the policy's weights left partitioned while it samples (ds3_gather_for_generation false: each layer is
fetched as generation reaches it, all processes step together), and both must agree (same seeds, same data split
-> the same numbers). ZeRO-3 with the gathered policy runs in test_multiprocess.py (two machines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.policy_optimization.test_training_scripts import HIDE_GPUS, ROOT, read_metrics, run_script, script_env


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_deepspeed_zero2_and_zero3_ppo(tmp_path):
    run_script("train_slf5k.sh", tmp_path / "z2", DEEPSPEED="zero2", PHASES="ppo", DS_ACCELERATOR="cpu", **HIDE_GPUS)
    z2 = read_metrics(tmp_path / "z2" / "tiny" / "ppo")
    assert [m["episodes"] for m in z2] == [4, 8]  # batch_size 4 is the global batch: 2 processes x 2 rollouts

    world = tmp_path / "z2" / "tiny" / "world"
    out3 = tmp_path / "z3"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "configs" / "accelerate" / "cpu_deepspeed_zero3.yaml"), "-m", "policy_optimization.train",
        "--config", str(ROOT / "configs" / "slf5k" / "ppo.yaml"), "--model_name_or_path", str(world / "model"),
        "--adapter", "none", "--dataset_path", str(world / "data" / "rl_prompts.jsonl"),
        "--critic", "reference", "--critic_kwargs", '{"reference_field": "reference"}',
        "--num_iterations", "2", "--batch_size", "4", "--num_mini_batches", "2", "--num_ppo_epochs", "1",
        "--response_length", "12", "--dtype", "auto", "--gradient_checkpointing", "false", "--progress_bar", "false",
        "--ds3_gather_for_generation", "false", "--output_dir", str(out3),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=script_env(tmp_path, DS_ACCELERATOR="cpu", **HIDE_GPUS), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    z3 = read_metrics(out3)
    for a, b in zip(z2, z3):
        for key in ("reward/score_mean", "objective/kl", "response/length_mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
    saved = json.loads((out3 / "policy" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(world / "model")
    assert (out3 / "checkpoint-2" / "pytorch_model").is_dir()  # DeepSpeed's sharded checkpoint
