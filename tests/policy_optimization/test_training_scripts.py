"""Each per-dataset training script runs end to end in tiny mode (TEXT2GRAD_TINY=1), as CI would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Processes launched as CPU ranks (gloo, DS_ACCELERATOR=cpu) must not see a GPU: on a GPU machine accelerate and
# DeepSpeed would otherwise put them on cuda:<LOCAL_RANK> (more ranks than GPUs: "invalid device ordinal"), and a
# comparison with a one-process run would compare a GPU run with a CPU one.
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": ""}


def script_env(out: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TEXT2GRAD_TINY="1", OUT=str(out), PYTHON=sys.executable, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    env.update(extra)
    return env


def run_script(name: str, out: Path, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / name)], cwd=ROOT, env=script_env(out, **extra), capture_output=True, text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, phases",
    [("train_slf5k.sh", ["sft", "ppo", "dpo"]), ("train_kodcode.sh", ["ppo"]), ("train_ultrafeedback.sh", ["sft", "ppo"])],
)
def test_script_runs_in_tiny_mode(script, phases, tmp_path):
    proc = run_script(script, tmp_path, PHASES=" ".join(phases))
    tiny = tmp_path / "tiny"
    for phase in phases:
        assert f"phase: {phase}" in proc.stdout
    if "dpo" in phases:  # the DPO baseline on the dataset's own chosen/rejected pairs, from the SFT adapter
        assert (tiny / "dpo" / "adapter_config.json").is_file()
    if "sft" in phases:
        assert (tiny / "sft" / "adapter_config.json").is_file()
        assert (tiny / "ppo" / "base_merged" / "config.json").is_file()  # PPO started from the SFT adapter
    metrics = read_metrics(tiny / "ppo")
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert all(m["samples/feedback_error"] == 0 and m["spans/quotes"] > 0 for m in metrics)  # the critic answered
    assert (tiny / "ppo" / "policy" / "adapter_config.json").is_file()
