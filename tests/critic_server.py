"""The one real OpenAI-compatible server of a pytest run: vLLM's, serving SmolLM2-135M-Instruct on a CPU.

`critic_server` (a session fixture, registered in tests/conftest.py) is that server, on a free loopback port, run
through `reward_model.serve.CriticServer` (what ``text2grad serve-critic`` runs). Tests that use it are marked
``vllm_server`` (and ``slow``) and live in tests/test_critics_behind_a_server.py; tests/conftest.py runs them last.

Its start-up (a minute or two of vLLM loading on a CPU) is hidden behind the other tests: when the collected tests
include ``vllm_server`` ones, `launch_early` (tests/conftest.py's ``pytest_collection_finish``) launches the server
without waiting for it, and the fixture, first asked for after the other tests, only waits for ``/health``. An idle
server costs no CPU, only its memory (a few GB). Under pytest-xdist each worker would launch one, so there the
fixture launches its worker's server on first use instead. Whoever launched it, the server is stopped, its whole
process group, after the last test that uses it (tests/conftest.py) or when the session ends, whether the tests
passed, failed or were interrupted (`stop_early_launch`); a
pytest killed outright takes the server with it (the server dies with its parent, `reward_model.serve`). Its output
goes to a log file, whose tail is shown if it fails to start.

While working on those tests, start the server once and point the fixture at it (it then neither starts nor stops
one): ``text2grad serve-critic --reward_model <SmolLM2 asset folder> --served_model_name smollm2 --dtype float32
--max_model_len 2048 --port 8123``, then ``TEXT2GRAD_TEST_VLLM_SERVER=http://127.0.0.1:8123/v1 pytest -m vllm_server``.
"""

from __future__ import annotations

import importlib.util
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
    same weights a local reward model loads), the seconds from its launch until it was ready for the first test
    (its start-up, or more where it loaded while other tests ran), and the server itself."""

    base_url: str
    model: str
    model_dir: Path
    startup_s: float
    server: CriticServer | None  # None: a server started outside the test run


@dataclass
class LaunchedServer:
    """A server launched and not yet known to be ready: the server, its log, and when it was launched."""

    server: CriticServer
    log_path: Path
    launched_at: float


def launch_critic_server(log_dir: Path) -> LaunchedServer:
    """Launch the server (its process only: vLLM then loads for a minute or two) with its output in ``log_dir``."""
    cfg = ServeCriticConfig(reward_model=str(smollm2_path()), served_model_name=SERVED_NAME, port=0, dtype="float32",
                            max_model_len=2048, cpu_kv_cache_gb=1, startup_timeout_s=900)
    log_path = log_dir / "server.log"
    server = CriticServer(cfg, log=log_path.open("w"))
    launched_at = time.perf_counter()
    try:
        server.launch()
    except BaseException:
        server.log.close()
        raise
    return LaunchedServer(server, log_path, launched_at)


def wait_for_critic_server(launched: LaunchedServer) -> RunningServer:
    """The launched server once it answers; raises with the log's tail if it cannot start."""
    try:
        base_url = launched.server.wait_ready()
    except Exception:  # (an interrupt stays one: wait_ready has stopped the server)
        launched.server.log.close()
        tail = "\n".join(launched.log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"the vLLM server did not start; the end of its log ({launched.log_path}):\n{tail}") from None
    return RunningServer(base_url, SERVED_NAME, smollm2_path(), time.perf_counter() - launched.launched_at,
                         launched.server)


_EARLY = pytest.StashKey[LaunchedServer]()


def launch_early(session: pytest.Session) -> None:
    """Launch the server now, without waiting, if the tests about to run will ask for it and no server is given
    (see the module docs). vLLM's presence is checked without importing it: a broken install shows when the
    fixture checks again (and stops this server)."""
    config = session.config
    if (config.option.collectonly or os.environ.get(EXTERNAL_SERVER_ENV) or hasattr(config, "workerinput")
            or importlib.util.find_spec("vllm") is None
            or not any(item.get_closest_marker("vllm_server") for item in session.items)):
        return
    try:  # the fixture `tmp_path_factory` is this object: the log then lives with the run's other temporary files
        config.stash[_EARLY] = launch_critic_server(config._tmp_path_factory.mktemp("critic_server"))
    except Exception:  # e.g. a missing model asset: the fixture tries again and reports it where a test asks
        return


def stop_early_launch(session: pytest.Session) -> None:
    """Stop a server launched by `launch_early` (the fixture's own stop already did, if it was used)."""
    launched = session.config.stash.get(_EARLY, None)
    if launched is not None:
        launched.server.stop()
        launched.server.log.close()


_IN_USE: list[LaunchedServer] = []  # the server the fixture hands out in this process, until it is stopped


def stop_server_in_use() -> None:
    """Stop the server the fixture hands out in this process, if any: tests/conftest.py calls this after the last
    test that uses it, so that under pytest-xdist an idle server does not hold its memory through the worker's other
    tests (stopping twice is harmless)."""
    while _IN_USE:
        _IN_USE.pop().server.stop()


@pytest.fixture(scope="session")
def critic_server(request, tmp_path_factory):
    """The test run's vLLM server (see the module docs); skips where vllm is not importable."""
    external = os.environ.get(EXTERNAL_SERVER_ENV)
    if external:
        yield RunningServer(external.rstrip("/"), SERVED_NAME, smollm2_path(), 0.0, None)
        return
    launched = request.config.stash.get(_EARLY, None)
    if not vllm_available():
        if launched is not None:
            launched.server.stop()
        pytest.skip("vllm is not importable in this environment (install the 'vllm' extra: see env.sh)")
    if launched is None:
        launched = launch_critic_server(tmp_path_factory.mktemp("critic_server"))
    waited_from = time.perf_counter()
    running = wait_for_critic_server(launched)
    _IN_USE.append(launched)
    print(f"\nvLLM server for the critic tests: {running.base_url}, launched {running.startup_s:.0f} s before its first "
          f"test, {time.perf_counter() - waited_from:.0f} s of them waited for here (log {launched.log_path})")
    try:
        yield running
    finally:
        running.server.stop()
        launched.server.log.close()
