"""Task score functions for the scalar, score_spread and mixed reward modes (``scalar_source: package.module:name``).

The critics that write span feedback are built by the one registry in `text2grad.core.critics`; a score
function is the other, scalar, input of the reward modes, loaded with the same spec loader.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from text2grad.core.critics import load_object

__all__ = ["build_score_fn"]


def build_score_fn(
    spec: str, kwargs: Mapping[str, Any] | None = None, records: Sequence[Mapping[str, Any]] | None = None
) -> Callable[[Sequence[str], Sequence[str]], list[float]]:
    """A task score function ``fn(prompts, responses) -> list[float]`` from ``"package.module:name"``.

    A class is instantiated with ``kwargs`` (and bound to ``records`` if it has ``bind_records``); the
    result (or a plain function) must be callable with (prompts, responses).
    """
    obj = load_object(spec)
    if isinstance(obj, type):
        obj = obj(**dict(kwargs or {}))
        if records is not None and callable(getattr(obj, "bind_records", None)):
            obj.bind_records(records)
    elif kwargs:
        raise ValueError(f"{spec!r} is a function; scalar_source_kwargs only apply to classes")
    if not callable(obj):
        raise TypeError(f"score function {spec!r} is not callable")
    return obj
