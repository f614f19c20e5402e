"""tests/conftest.py's ordering of the vLLM tests: the engine tests together, LoRA-request module last, engine closed
after them; the server tests last, their server launched when the run starts and stopped when it ends."""

from __future__ import annotations

import sys
import types

import pytest

from tests import conftest, critic_server
from tests.vllm_testlib import engine_for_tests


def _module(name: str, engine: bool, lora_mode: str | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    if engine:
        module.engine_for_tests = engine_for_tests
    if lora_mode:
        module.VLLM_ENGINE_LORA_MODE = lora_mode
    return module


class _Item:
    def __init__(self, name: str, module: types.ModuleType, markers: tuple[str, ...] = ()):
        self.name, self.module, self.markers = name, module, markers

    def __repr__(self) -> str:
        return self.name

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.markers else None


def _items() -> list[_Item]:
    plain, other = _module("plain", False), _module("other", False)
    engine_a, engine_b = _module("engine_a", True), _module("engine_b", True)
    lora = _module("lora", True, lora_mode="adapter")
    return [_Item("plain1", plain), _Item("a1", engine_a), _Item("a2", engine_a), _Item("other1", other),
            _Item("lora1", lora), _Item("lora2", lora), _Item("b1", engine_b), _Item("plain2", plain)]


def test_engine_tests_run_together_where_the_first_was_collected_with_lora_requests_last():
    items = _items()
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.name for item in items] == ["plain1", "a1", "a2", "b1", "lora1", "lora2", "other1", "plain2"]


def test_a_run_without_engine_tests_keeps_its_order():
    items = [item for item in _items() if conftest._engine_module_rank(item) is None]
    names = [item.name for item in items]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.name for item in items] == names


def test_the_engine_is_closed_after_the_last_engine_test_only(monkeypatch):
    closed = []
    fake = types.ModuleType("text2grad.core.vllm_engine")
    fake.close_shared_engine = lambda: closed.append(True)
    monkeypatch.setitem(sys.modules, "text2grad.core.vllm_engine", fake)
    items = _items()
    conftest.pytest_collection_modifyitems(None, items)
    closed_after = []
    for item, nextitem in zip(items, [*items[1:], None]):
        conftest.pytest_runtest_teardown(item, nextitem)
        if closed:
            closed_after.append(item.name)
            closed.clear()
    assert closed_after == ["lora2"]
    conftest.pytest_runtest_teardown(_Item("a1", _module("engine_a", True)), None)  # a run that ends with one
    assert closed == [True]


def test_the_server_tests_run_last_in_their_order():
    items = _items()
    server = _module("server", False)
    items[1:1] = [_Item("s1", server, ("slow", "vllm_server")), _Item("s2", server, ("slow", "vllm_server"))]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.name for item in items] == ["plain1", "a1", "a2", "b1", "lora1", "lora2", "other1", "plain2", "s1", "s2"]


class _FakeServer:
    def __init__(self):
        self.stopped = 0
        self.log = open(__file__)

    def stop(self):
        self.stopped += 1


def _session(items, collectonly=False):
    config = types.SimpleNamespace(option=types.SimpleNamespace(collectonly=collectonly), stash=pytest.Stash())
    return types.SimpleNamespace(config=config, items=items)


@pytest.fixture
def launches(monkeypatch, tmp_path):
    """`critic_server.launch_early` with the server's launch recorded instead of made."""
    made = []

    def launch(log_dir):
        made.append(critic_server.LaunchedServer(_FakeServer(), log_dir / "server.log", 0.0))
        return made[-1]

    monkeypatch.delenv(critic_server.EXTERNAL_SERVER_ENV, raising=False)
    monkeypatch.setattr(critic_server, "launch_critic_server", launch)
    monkeypatch.setattr(critic_server.importlib.util, "find_spec", lambda name: object())
    return made


def test_the_server_is_launched_at_the_start_only_for_a_run_with_server_tests(launches, monkeypatch, tmp_path):
    factory = types.SimpleNamespace(mktemp=lambda name: tmp_path)
    server_test = _Item("s1", _module("server", False), ("vllm_server",))
    for session in (_session(_items()), _session([server_test], collectonly=True)):
        session.config._tmp_path_factory = factory
        conftest.pytest_collection_finish(session)
    assert launches == []
    monkeypatch.setenv(critic_server.EXTERNAL_SERVER_ENV, "http://127.0.0.1:1/v1")  # a server is given
    session = _session([server_test])
    session.config._tmp_path_factory = factory
    conftest.pytest_collection_finish(session)
    assert launches == []

    monkeypatch.delenv(critic_server.EXTERNAL_SERVER_ENV)
    conftest.pytest_collection_finish(session)
    assert len(launches) == 1 and launches[0].server.stopped == 0  # launched, not waited for
    conftest.pytest_sessionfinish(session)  # however the run ended, the server stops with it
    assert launches[0].server.stopped == 1 and launches[0].server.log.closed
