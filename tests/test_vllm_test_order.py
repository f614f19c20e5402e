"""tests/conftest.py's ordering of the vLLM tests: the engine tests together, LoRA-request module last, engine closed
after them; the server tests last, their server launched when the run starts and stopped after its last test; and,
under pytest-xdist (``--dist loadgroup``, as scripts/test.sh runs), their group: one worker for every vLLM and GPU
module, one group per other module."""

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
    def __init__(self, name: str, module: types.ModuleType, markers: tuple[str, ...] = (), fixturenames: tuple[str, ...] = ()):
        self.name, self.module, self.markers, self.fixturenames = name, module, list(markers), fixturenames
        self.nodeid = f"{module.__name__}::{name}"  # a test's node id starts with its module's path
        self.groups: list[str] = []
        self.config = _Config("no")

    def __repr__(self) -> str:
        return self.name

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.markers else None

    def iter_markers(self, name: str):
        return iter([name] if name in self.markers else [])

    def add_marker(self, mark) -> None:
        assert mark.name in ("xdist_group", "skip")  # skip: a gpu test where no GPU is visible
        if mark.name == "xdist_group":
            self.groups.append(mark.args[0])


class _PluginManager:
    def __init__(self, xdist: bool):
        self.xdist = xdist

    def hasplugin(self, name: str) -> bool:
        return name == "xdist" and self.xdist


class _Config:
    """A run's config as the hook reads it; ``worker``: as an xdist worker sees it (``dist`` "no", ``loadgroup``
    True when the run distributes by group)."""

    def __init__(self, dist: str, xdist: bool = True, worker: bool = False):
        self.pluginmanager, self.stash = _PluginManager(xdist), {}
        self.options = {"dist": "no", "loadgroup": dist == "loadgroup"} if worker else {"dist": dist}

    def getoption(self, name: str, default=None):
        return self.options.get(name, default)


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


def _items_with_a_server_module(config: _Config) -> list[_Item]:
    server, mixed, gpu, slow = _module("server", False), _module("mixed", False), _module("gpu", False), _module("slow", False)
    items = [*_items(), _Item("s1", server, markers=("vllm_server", "slow"), fixturenames=("critic_server",)),
             _Item("m1", mixed), _Item("m2", mixed, fixturenames=("tmp_path", "critic_server")), _Item("x1", slow),
             _Item("g1", gpu, markers=("gpu",)), _Item("x2", slow, markers=("slow",))]
    for item in items:
        item.config = config
    return items


@pytest.mark.parametrize("worker", [False, True])
def test_under_loadgroup_vllm_and_gpu_modules_share_one_group_that_runs_first_then_slow_modules(worker):
    config = _Config("loadgroup", worker=worker)
    items = _items_with_a_server_module(config)
    conftest.pytest_collection_modifyitems(config, items)
    groups = {item.name: item.groups for item in items}
    for name in ("a1", "a2", "b1", "lora1", "lora2", "s1", "m1", "m2", "g1"):  # m1: its module has a server test
        assert groups[name] == ["vllm-and-gpu"], name
    assert groups["plain1"] == groups["plain2"] == ["plain"] and groups["other1"] == ["other"]
    assert groups["x1"] == groups["x2"] == ["slow"]
    # the one group first, its server tests leading (its worker waits for the server while the others work), then
    # its engine block (still together, LoRA requests last); then the module with a slow test (whole), then the
    # rest in their collected order
    assert [item.name for item in items] == ["s1", "m2", "a1", "a2", "b1", "lora1", "lora2", "m1", "g1", "x1", "x2",
                                             "plain1", "other1", "plain2"]


def test_without_loadgroup_no_test_gets_a_group_or_moves():
    for config in (_Config("load"), _Config("load", worker=True), _Config("loadgroup", xdist=False), _Config("no")):
        items = _items_with_a_server_module(config)
        conftest.pytest_collection_modifyitems(config, items)
        assert all(item.groups == [] for item in items)
        assert [item.name for item in items][:8] == ["plain1", "a1", "a2", "b1", "lora1", "lora2", "other1", "plain2"]


def test_the_server_stops_after_the_last_test_that_uses_it(monkeypatch):
    stopped = []
    monkeypatch.setattr(conftest, "stop_server_in_use", lambda: stopped.append(True))
    for config in (_Config("loadgroup"), _Config("no")):
        items = _items_with_a_server_module(config)
        conftest.pytest_collection_modifyitems(config, items)
        stopped_after = []
        for item, nextitem in zip(items, [*items[1:], None]):
            conftest.pytest_runtest_teardown(item, nextitem)
            if stopped:
                stopped_after.append(item.name)
                stopped.clear()
        assert stopped_after == (["m2"] if config.options["dist"] == "loadgroup" else ["s1"])


def test_the_time_summary_adds_up_each_module_and_the_device_group():
    seconds = {}
    saved = dict(conftest._TEST_SECONDS)
    conftest._TEST_SECONDS.clear()
    try:
        for nodeid, duration in [("suite/a.py::t1@vllm-and-gpu", 30.0), ("suite/a.py::t2@vllm-and-gpu", 12.5),
                                 ("suite/b.py::t1@suite/b.py", 4.0), ("suite/c.py::t[x@y]@suite/c.py", 50.0),
                                 ("suite/b.py::t2@suite/b.py", 1.0)]:
            conftest.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid, duration=duration))
        seconds = dict(conftest._TEST_SECONDS)
    finally:
        conftest._TEST_SECONDS.clear()
        conftest._TEST_SECONDS.update(saved)
    assert seconds == {"suite/a.py@vllm-and-gpu": 42.5, "suite/b.py@suite/b.py": 5.0, "suite/c.py@suite/c.py": 50.0}
    assert conftest.module_time_lines(seconds, top=2) == [
        "    42.5s  the vllm-and-gpu group (one worker)",
        "    55.0s  the other modules (every worker)",
        "    50.0s  suite/c.py",
        "    42.5s  suite/a.py (vllm-and-gpu)",
    ]
    assert conftest.module_time_lines({"suite/b.py": 5.0}) == ["     5.0s  suite/b.py"]  # without xdist: no groups
