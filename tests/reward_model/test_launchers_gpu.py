"""The DeepSpeed launcher on one GPU: ZeRO-2 reward-model training in bf16 (the CPU launches: test_launchers.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reward_model.serve import free_port
from tests.reward_model.test_launchers import _env, _tail
from tests.reward_model.test_train import mean_loss
from tests.reward_model.rm_testlib import train_args
from tests.test_gpu import run_or_fail
from text2grad.core.modeling import load_causal_lm, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_zero2_trains_the_reward_model_on_one_gpu_in_bf16(rm_world, tmp_path):
    out = tmp_path / "ds"
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", str(free_port("127.0.0.1")),
        "--module", "reward_model.train",
        *train_args(rm_world, out, max_steps=4, per_device_train_batch_size=2, learning_rate=1e-2, bf16=True,
                    deepspeed=str(REPO / "configs" / "deepspeed" / "zero2.json")),
    ]
    proc = run_or_fail(cmd, _env(CUDA_VISIBLE_DEVICES="0"))  # a launch that hangs fails with what it printed
    assert proc.returncode == 0, _tail(proc)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
    tokenizer = load_tokenizer(str(rm_world / "base"))
    before = mean_loss(load_causal_lm(str(rm_world / "base")), tokenizer)
    after = mean_loss(load_causal_lm(str(out)), tokenizer)
    assert after < before, (before, after)
