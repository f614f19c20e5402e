"""tests/conftest.py's ordering of the vLLM-engine tests: together, LoRA-request module last, engine closed after them."""

from __future__ import annotations

import sys
import types

from tests import conftest
from tests.vllm_testlib import engine_for_tests


def _module(name: str, engine: bool, lora_mode: str | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    if engine:
        module.engine_for_tests = engine_for_tests
    if lora_mode:
        module.VLLM_ENGINE_LORA_MODE = lora_mode
    return module


class _Item:
    def __init__(self, name: str, module: types.ModuleType):
        self.name, self.module = name, module

    def __repr__(self) -> str:
        return self.name

    def get_closest_marker(self, name: str) -> None:  # no test here is marked (the gpu marker is looked up)
        return None


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
