"""Judge prompt templates (package data), read with `text2grad.apps.evaluation.judge.load_prompt`."""
