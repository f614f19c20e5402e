"""The configuration of ``text2grad serve-critic`` / ``python -m reward_model.serve`` (`ServeCriticConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from text2grad.core.config import ConfigError, config_field, range_problems

__all__ = ["ServeCriticConfig", "LOOPBACK_HOSTS"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeCriticConfig:
    """Serve a trained generative reward model from vLLM's OpenAI-compatible server, for PPO's critic
    (backend "openai"), annotation or the judge. Runs until Ctrl-C (or SIGTERM), then stops the server."""

    # what `--help` says above the options (`text2grad.core.config.build_parser`)
    CLI_DESCRIPTION: ClassVar[str] = (
        "Serve a trained reward model from vLLM's OpenAI-compatible server (started as python -m "
        "vllm.entrypoints.openai.api_server: the `vllm serve` script of vLLM's CPU build fails). Waits for /health, "
        "prints the base URL and the critic settings to paste into PPO (critic reward_model, backend openai), and "
        "runs until Ctrl-C or SIGTERM, which stop the server. Example: text2grad serve-critic --reward_model "
        "outputs/slf5k/reward_model --port 8000"
    )

    reward_model: str = config_field(
        "",
        "The trained reward model: a LoRA training output directory (adapter_config.json), a merged model "
        "(text2grad merge-rm) or a full fine-tune.",
    )
    served_model_name: str = config_field(
        "text2grad-reward-model", "The model name clients ask for (the critic kwarg model; --model of annotate)."
    )
    host: str = config_field(
        "127.0.0.1",
        "Address to listen on. Localhost by default; any other address (e.g. 0.0.0.0 for PPO jobs on other "
        "machines) requires an API key in the --api_key_env variable.",
    )
    port: int = config_field(8000, "Port to listen on (0: a free port, printed when the server is up).")
    api_key_env: str = config_field(
        "TEXT2GRAD_CRITIC_API_KEY",
        "Environment variable holding the key clients must send (the key is never a flag, printed or logged). "
        "Unset: no key (allowed on localhost only).",
    )
    lora_mode: Literal["auto", "merged", "adapter"] = config_field(
        "auto",
        "How a LoRA reward model is served: merged (folded into its base model in a temporary folder, removed "
        "at exit), adapter (vLLM --enable-lora with the adapter as the served model), or auto (adapter on a GPU, "
        "merged on a CPU, where vLLM's LoRA kernels are slow).",
    )
    dtype: str = config_field("auto", "Weights dtype for vLLM (auto, bfloat16, float16, float32).")
    max_model_len: int | None = config_field(
        None, "Longest prompt + critique in tokens (vLLM's --max-model-len); default: the model's own limit."
    )
    gpu_memory_utilization: float | None = config_field(
        None, "Share of the GPU vLLM takes (weights + KV cache); default: vLLM's."
    )
    cpu_kv_cache_gb: int = config_field(
        1, "CPU only: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE; a value already in the environment wins)."
    )
    startup_timeout_s: float = config_field(
        900.0, "Give up (and stop the server) if /health has not answered after this many seconds."
    )
    work_dir: str | None = config_field(
        None, "Where the merged weights are written (default: a temporary folder); removed when the server stops."
    )
    vllm_args: list[str] = config_field(
        [],
        "More arguments for vLLM's server, as a JSON list, e.g. '[\"--tensor-parallel-size\", \"2\"]'.",
    )

    def __post_init__(self) -> None:
        problems = range_problems(self, positive=("max_model_len", "startup_timeout_s", "cpu_kv_cache_gb"),
                                  non_negative=("port",), share=("gpu_memory_utilization",))
        if self.port > 65535:
            problems.append(f"port must be at most 65535, got {self.port}")
        if not self.served_model_name.strip():
            problems.append("served_model_name may not be empty")
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def loopback(self) -> bool:
        """True when only this machine can connect."""
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")
