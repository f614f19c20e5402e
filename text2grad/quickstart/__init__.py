"""The embedded default: a complete offline Text2Grad run on a generated toy task (``python -m text2grad.quickstart``)."""

from text2grad.quickstart.pipeline import QuickstartConfig, main, run

__all__ = ["QuickstartConfig", "main", "run"]
