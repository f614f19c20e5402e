"""Which isolation layers this machine supports, probed once (and again with ``isolation(refresh=True)``)."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Sequence

logger = logging.getLogger("text2grad.core.sandbox")

@dataclass(frozen=True)
class Isolation:
    """The isolation layers available on this machine.

    Attributes:
        unshare_prefix: the ``unshare`` command line that creates the namespaces, or () if unavailable.
        drop_uid: run programs under a fresh unprivileged uid (we are root and the interpreter is usable).
        notes: why a layer is missing (also logged once as a warning).
        worker: programs are forked by a pre-started worker (needs pidfds, and a PID namespace or the uid
            switch to account for every process of a run); otherwise each run starts a fresh interpreter.
    """

    unshare_prefix: tuple[str, ...]
    drop_uid: bool
    notes: tuple[str, ...] = ()
    worker: bool = False

    @property
    def namespaces(self) -> bool:
        return bool(self.unshare_prefix)


def probe_platform() -> Isolation:
    """The layers this platform allows, from the environment and cheap checks (no sandboxed run yet)."""
    disabled = {s.strip() for s in os.environ.get("TEXT2GRAD_SANDBOX_DISABLE", "").split(",") if s.strip()}
    unknown = disabled - {"namespaces", "setuid", "worker"}
    if unknown:
        raise ValueError(f"TEXT2GRAD_SANDBOX_DISABLE has unknown name(s) {sorted(unknown)}; use namespaces,setuid,worker")
    notes: list[str] = []
    is_root = os.geteuid() == 0
    prefix: tuple[str, ...] = ()
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if "namespaces" in disabled:
        notes.append("namespaces disabled by TEXT2GRAD_SANDBOX_DISABLE: programs can use the network and shared /tmp")
    elif not sys.platform.startswith("linux") or unshare is None:
        notes.append("no `unshare` binary (util-linux): programs can use the network, no PID/mount namespace")
    else:
        base = (unshare, "--net", "--mount", "--pid", "--ipc", "--fork", "--mount-proc", "--kill-child")
        candidates = [base] if is_root else [(unshare, "--user", "--map-root-user") + base[1:]]
        for cand in candidates:
            try:
                ok = subprocess.run([*cand, "true"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                prefix = cand
                break
        if not prefix:
            notes.append(
                "`unshare` cannot create namespaces here (needs root or unprivileged user namespaces): "
                "programs can use the network, no PID/mount namespace"
            )
    drop_uid = False
    if is_root and "setuid" in disabled:
        notes.append("uid switch disabled by TEXT2GRAD_SANDBOX_DISABLE: programs run as root (no RLIMIT_NPROC)")
    elif is_root:
        blocked = blocked_dirs(interpreter_paths())
        if blocked and not prefix:
            notes.append(
                f"the interpreter lies under {blocked[0]}, which an unprivileged uid cannot enter, and there is "
                "no mount namespace to expose it: programs run as root (no RLIMIT_NPROC, can write root's files)"
            )
        else:
            drop_uid = True
    elif not is_root:
        notes.append("not running as root: programs keep our uid (they can write what we can write)")
    worker = "worker" not in disabled and (bool(prefix) or drop_uid) and _pidfds_work()
    return Isolation(prefix, drop_uid, tuple(notes), worker)


def _pidfds_work() -> bool:
    """pidfd_open (Linux >= 5.3) and fd passing: how the harness holds and kills a run forked by the worker."""
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def site_sys_path() -> list[str]:
    """``sys.path`` of ``python -I`` (what `site` builds), computed once: the import path of every program (the
    worker and the bootstrap start with -S); our own sys.path if it cannot be computed."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        paths = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        paths = None
    if not isinstance(paths, list):  # fall back to our own import path, which `site` built
        paths = [p for p in sys.path if p and os.path.isabs(p)]
    return [p for p in paths if isinstance(p, str)]


@functools.lru_cache(maxsize=1)
def interpreter_paths() -> tuple[str, ...]:
    """Paths the program's interpreter must reach: the interpreter, its prefixes, sys.path and the site path,
    each also as its real path. A venv reached through a symlink (``.venv -> /data/venvs/x``) is then checked for
    folders an unprivileged uid cannot enter along its real location, and those folders are exposed like any other
    (`blocked_dirs` follows the symlink only at the link, not the private folders behind it)."""
    paths = {sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths |= {p for p in [*sys.path, *site_sys_path()] if p and os.path.isabs(p)}
    paths |= {os.path.realpath(p) for p in paths}
    return tuple(sorted(p for p in paths if os.path.exists(p)))


def blocked_dirs(paths: Sequence[str]) -> list[str]:
    """Ancestors of ``paths`` that users other than the owner cannot traverse (no o+x), outermost first: every
    one on the way, not only the first (a private folder inside another, e.g. a venv kept under a 700 folder
    inside the caller's own 700 temporary folder, needs both exposed)."""
    blocked: set[str] = set()
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)[1:]
        cur = ""
        for part in parts[:-1] if not os.path.isdir(path) else parts:
            cur = f"{cur}/{part}"
            try:
                mode = os.stat(cur).st_mode
            except OSError:
                break
            if not mode & 0o001:
                blocked.add(cur)
    return sorted(blocked, key=lambda p: (p.count("/"), p))


