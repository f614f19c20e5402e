"""The embedded default: a complete offline Text2Grad run on a generated toy task (``python -m text2grad.apps.quickstart``)."""

from text2grad.apps.quickstart.pipeline import QuickstartConfig, main, run

__all__ = ["QuickstartConfig", "main", "run"]
