"""Shared helpers of the sandbox tests: survivor checks and the degraded-platform fixture."""

from __future__ import annotations

import os

import pytest

from text2grad.core import sandbox


def survivors(result) -> list[int]:
    """Processes still alive that belong to the run: its uid, or its run id in their environment."""
    marker = f"TEXT2GRAD_SANDBOX_RUN={result.run_id}".encode()
    alive = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if result.sandbox_uid is not None and os.stat(f"/proc/{pid}").st_uid == result.sandbox_uid:
                alive.append(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    alive.append(pid)
        except OSError:
            continue
    return [p for p in alive if not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def assert_clean(result) -> None:
    assert result.leftover_processes == 0
    assert survivors(result) == []


@pytest.fixture
def degraded(monkeypatch):
    """Namespaces and the uid switch turned off, as on a platform without them."""
    monkeypatch.setenv("TEXT2GRAD_SANDBOX_DISABLE", "namespaces,setuid")
    sandbox.isolation(refresh=True)
    yield
    monkeypatch.delenv("TEXT2GRAD_SANDBOX_DISABLE")
    sandbox.isolation(refresh=True)
