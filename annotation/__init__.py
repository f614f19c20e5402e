"""Phase 1 of Text2Grad: dual-feedback annotation (critique + good/poor spans) of (prompt, response) records.

Run it with ``python -m text2grad.annotate`` (see annotation/README.md). Library entry points:

- `annotation.llm.LLMCritic`: an OpenAI-compatible model as a `FeedbackSource` (also for the policy phase);
- `annotation.critics.CodeTestCritic`: unit tests in the sandbox as a `FeedbackSource`;
- `annotation.runner.run_annotation`: the resumable, budgeted annotation run for an `AnnotationConfig`.
"""
