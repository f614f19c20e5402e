"""``text2grad feedback-ui`` / ``python -m text2grad.apps.feedback_ui``: people write critiques and mark good/poor
spans on a local web page; every submission is an annotation record the reward model trains on.

    text2grad feedback-ui --dataset_path samples.jsonl --output human_feedback.jsonl      # serve the page
    text2grad feedback-ui --output human_feedback.jsonl --agreement true                  # annotator agreement
    text2grad feedback-ui --dataset_path samples.jsonl --label_studio_dir ls/             # Label Studio config + tasks
    text2grad feedback-ui --import_label_studio export.json --output human_feedback.jsonl # Label Studio export in

Records have the annotate command's layout (``id, prompt, response, critique, good_spans, poor_spans,
unmatched_spans, source, meta``) with ``source: "human"``, ``annotator``, ``started_at``, ``submitted_at`` and the
exact ``span_offsets``; see the package README for the page, the guarantees and the multi-person set-up.

The command is in cli.py, its configuration in feedback_ui_config.py. Names are loaded on first use
(`text2grad.core.critics.lazy_exports`), so the configuration alone, as ``text2grad feedback-ui --help`` reads it, loads no
ML library.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_EXPORTS = dict.fromkeys(["FeedbackUIConfig", "load_items", "build_server", "run", "main"], "text2grad.apps.feedback_ui.cli")

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
