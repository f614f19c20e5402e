"""Judge prompt templates (package data), read with `text2grad.evaluation.judge.load_prompt`."""
