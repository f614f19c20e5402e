"""Records what a model was conditioned on: the exact prompt ids of every `text2grad.core.generation.generate` call."""

from __future__ import annotations

from types import ModuleType


def record_prompt_ids(monkeypatch, module: ModuleType) -> list[list[int]]:
    """Wrap ``module.generate`` (the name the module imported) so that every generation's prompt ids are appended to
    the returned list, in order."""
    seen: list[list[int]] = []
    real_generate = module.generate

    def recording_generate(*args, **kwargs):
        generations = real_generate(*args, **kwargs)
        seen.extend(g.prompt_ids for g in generations)
        return generations

    monkeypatch.setattr(module, "generate", recording_generate)
    return seen
