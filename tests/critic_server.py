"""The one real OpenAI-compatible server of a pytest run: vLLM's, serving SmolLM2-135M-Instruct on a CPU.

`critic_server` (a session fixture, registered in tests/conftest.py) starts it on a free loopback port through
`reward_model.serve.CriticServer` (what ``text2grad serve-critic`` runs) the first time a test asks for it, and stops
its whole process group when the session ends, whether the tests passed, failed or were interrupted; a pytest
killed outright takes the server with it (the server dies with its parent, `reward_model.serve`). Its output goes
to a log file, whose tail is shown if it fails to start. Tests that use it are marked ``vllm_server`` (and
``slow``) and live in tests/test_critics_behind_a_server.py.

While working on those tests, start the server once and point the fixture at it (it then neither starts nor stops
one): ``text2grad serve-critic --reward_model <SmolLM2 asset folder> --served_model_name smollm2 --dtype float32
--max_model_len 2048 --port 8123``, then ``TEXT2GRAD_TEST_VLLM_SERVER=http://127.0.0.1:8123/v1 pytest -m vllm_server``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from reward_model.serve import CriticServer
from reward_model.serve_config import ServeCriticConfig
from text2grad.core.assets import smollm2_path
from text2grad.core.vllm_engine import vllm_available

SERVED_NAME = "smollm2"
EXTERNAL_SERVER_ENV = "TEXT2GRAD_TEST_VLLM_SERVER"  # a server already running (see above)


@dataclass
class RunningServer:
    """What the tests need of the server: its URL, the model name it serves, the model folder it serves (the
    same weights a local reward model loads), how long it took to start, and the server itself."""

    base_url: str
    model: str
    model_dir: Path
    startup_s: float
    server: CriticServer | None  # None: a server started outside the test run


def start_critic_server(log_path: Path) -> RunningServer:
    """Start the server (about 100 s on a busy 2-core machine); raises with the log's tail if it cannot start."""
    cfg = ServeCriticConfig(reward_model=str(smollm2_path()), served_model_name=SERVED_NAME, port=0, dtype="float32",
                            max_model_len=2048, cpu_kv_cache_gb=1, startup_timeout_s=900)
    log = log_path.open("w")
    server = CriticServer(cfg, log=log)
    start = time.perf_counter()
    try:
        base_url = server.start()
    except BaseException:
        log.close()
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"the vLLM server did not start; the end of its log ({log_path}):\n{tail}") from None
    return RunningServer(base_url, SERVED_NAME, smollm2_path(), time.perf_counter() - start, server)


@pytest.fixture(scope="session")
def critic_server(tmp_path_factory):
    """The test run's vLLM server (see the module docs); skips where vllm is not importable."""
    external = os.environ.get(EXTERNAL_SERVER_ENV)
    if external:
        yield RunningServer(external.rstrip("/"), SERVED_NAME, smollm2_path(), 0.0, None)
        return
    if not vllm_available():
        pytest.skip("vllm is not importable in this environment (install the 'vllm' extra: see env.sh)")
    log_path = tmp_path_factory.mktemp("critic_server") / "server.log"
    running = start_critic_server(log_path)
    print(f"\nvLLM server for the critic tests: {running.base_url}, ready after {running.startup_s:.0f} s (log {log_path})")
    try:
        yield running
    finally:
        running.server.stop()
