"""Several threads writing the same file at once: the race two study processes on one task instance run into."""

from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def write_at_once(write: Callable[[T], None], versions: Sequence[T], times: int) -> list[OSError]:
    """Start one thread per version together (a barrier), each calling ``write(version)`` ``times`` times; returns
    the errors the writers hit (a writer stops at its first)."""
    start, errors = threading.Barrier(len(versions)), []

    def write_many(version: T) -> None:
        start.wait()
        try:
            for _ in range(times):
                write(version)
        except OSError as err:
            errors.append(err)

    threads = [threading.Thread(target=write_many, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
