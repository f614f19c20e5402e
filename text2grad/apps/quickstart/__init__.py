"""The embedded default: a complete offline Text2Grad run on a generated toy task (``python -m text2grad.apps.quickstart``).

`QuickstartConfig` is in quickstart_config.py, the size presets and `resolve` in presets.py, the stages and `main`
in pipeline.py.

Names are loaded on first use (`text2grad.core.critics.load_object`), so importing the configuration alone (as
``text2grad quickstart --help`` does) loads no ML library.
"""

from __future__ import annotations

from typing import Any

from text2grad.core.critics import load_object

_EXPORTS = {
    "QuickstartConfig": "text2grad.apps.quickstart.quickstart_config",
    "main": "text2grad.apps.quickstart.pipeline",
    "run": "text2grad.apps.quickstart.pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return load_object(f"{_EXPORTS[name]}:{name}")
    raise AttributeError(f"module 'text2grad.apps.quickstart' has no attribute {name!r}")
