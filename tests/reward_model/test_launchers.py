"""The real launchers: 2-process DeepSpeed ZeRO-2 and ZeRO-3 runs on CPU and the per-dataset shell scripts (ZeRO-2
on one GPU in bf16: test_launchers_gpu.py, a module of its own so that only it waits in the GPU tests' group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.reward_model.rm_testlib import RECORDS, train_args
from reward_model.inference import GenerativeRewardModel
from reward_model.serve import free_port
from tests.reward_model.test_train import mean_loss
from text2grad.core.modeling import load_causal_lm, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("zero_config", ["zero2.json", "zero3.json"])  # ~25 s each on 2 CPU cores
def test_deepspeed_two_cpu_processes_train_save_reload(rm_world, tmp_path, zero_config):
    out = tmp_path / "ds"
    port = free_port("127.0.0.1")
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(port),
        "--module", "reward_model.train",
        *train_args(rm_world, out, max_steps=4, save_steps=2, per_device_train_batch_size=1, learning_rate=1e-2,
                    deepspeed=str(REPO / "configs" / "deepspeed" / zero_config)),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES=""),  # CPU ranks: GPUs hidden
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, _tail(proc)
    # each rank removed DeepSpeed's shared-memory workspace (DeepSpeed leaves it in /dev/shm, ~66 MB per rank)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    state = json.loads((out / "trainer_state.json").read_text())
    # 4 steps x 1 sequence per process x 2 processes = 8 sequences = 2 epochs of the 4 records;
    # a run that silently fell back to one process would report 1 epoch.
    assert state["global_step"] == 4 and state["epoch"] == pytest.approx(2.0)
    assert (out / "checkpoint-2" / "global_step2").is_dir()  # ZeRO optimizer shards, for resuming
    assert (out / "checkpoint-2" / "text2grad_config.yaml").is_file()
    # Reload what rank 0 gathered and saved: a real adapter that changed the model.
    tokenizer = load_tokenizer(str(rm_world / "base"))
    before = mean_loss(load_causal_lm(str(rm_world / "base")), tokenizer)
    after = mean_loss(load_causal_lm(str(out)), tokenizer)
    assert after < before, (before, after)
    rm = GenerativeRewardModel.from_pretrained(str(out), max_new_tokens=8)
    assert len(rm.feedback([r["prompt"] for r in RECORDS], [r["response"] for r in RECORDS])) == len(RECORDS)


@pytest.mark.slow
def test_slf5k_script_trains_offline_and_merge_script_merges(tmp_path):
    work = tmp_path / "tiny"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_rm_slf5k.sh")],
        cwd=tmp_path, env=_env(TEXT2GRAD_TINY="1", TINY_DIR=str(work)), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, _tail(proc)
    rm_dir = work / "reward_model"
    assert (rm_dir / "adapter_model.safetensors").is_file() and (rm_dir / "text2grad_config.yaml").is_file()
    assert json.loads((rm_dir / "trainer_state.json").read_text())["global_step"] == 2
    merged = tmp_path / "merged"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "merge_rm.sh"), str(rm_dir), str(merged)],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, _tail(proc)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(str(merged))(ids).logits, load_causal_lm(str(rm_dir))(ids).logits,
                                   atol=1e-4, rtol=1e-4)
    usage = subprocess.run(["bash", str(REPO / "scripts" / "merge_rm.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


@pytest.mark.parametrize("dataset,name", [("slf5k", "SLF5K"), ("kodcode", "KodCode"), ("ultrafeedback", "UltraFeedback")])
def test_dataset_scripts_delegate_to_the_shared_script_with_their_dataset(dataset, name):
    """Each train_rm_<dataset>.sh is its usage header plus one line handing over to scripts/_train_rm.sh with its
    dataset, so the slow test's run of the SLF5K script covers the shared body the others run too."""
    script = REPO / "scripts" / f"train_rm_{dataset}.sh"
    lines = script.read_text().splitlines()
    code = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert code == [f'exec bash "$(dirname "${{BASH_SOURCE[0]}}")/_train_rm.sh" {dataset} "$@"']
    header = "\n".join(lines)
    assert f"Phase 2 on {name}:" in header and f"bash scripts/train_rm_{dataset}.sh" in header
    assert f"configs/{dataset}/reward_model.yaml" in header
    shared = REPO / "scripts" / "_train_rm.sh"
    for path in (script, shared):
        assert os.access(path, os.X_OK)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    usage = subprocess.run(["bash", str(shared)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
