"""The embedded default: a complete offline Text2Grad run on a generated toy task (``python -m text2grad.apps.quickstart``).

`QuickstartConfig` is in quickstart_config.py, the size presets and `resolve` in presets.py, the stages and `main`
in pipeline.py.

Names are loaded on first use (`text2grad.core.critics.lazy_exports`), so importing the configuration alone (as
``text2grad quickstart --help`` does) loads no ML library.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_EXPORTS = {
    "QuickstartConfig": "text2grad.apps.quickstart.quickstart_config",
    "main": "text2grad.apps.quickstart.pipeline",
    "run": "text2grad.apps.quickstart.pipeline",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
