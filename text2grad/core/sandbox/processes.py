"""Process bookkeeping shared by both launchers: bounded output sinks, and finding and killing a run's processes."""

from __future__ import annotations

import os
import signal
import threading
import time


class Sink:
    """Keeps the first ``limit`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.head, self.total = limit, bytearray(), 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]

    def text(self) -> tuple[str, bool]:
        """The kept bytes as text, with a marker if the stream was cut; and whether it was."""
        text = self.head.decode("utf-8", errors="replace")
        if self.total > len(self.head):
            text += f"\n[... truncated {self.total - len(self.head)} of {self.total} bytes by the text2grad sandbox ...]\n"
            return text, True
        return text, False


class Capture(Sink):
    """A `Sink` drained from a pipe by a thread of its own."""

    def __init__(self, stream, limit: int):
        super().__init__(limit)
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        try:
            while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else os.read(stream, 1 << 16):
                self.feed(chunk)
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close() if hasattr(stream, "close") else os.close(stream)
            except OSError:
                pass


def feed_stdin(pipe, data: bytes) -> None:
    """Write ``data`` to the program's stdin and close it (run in a thread: the program may not read)."""
    try:
        if isinstance(pipe, int):
            view = memoryview(data)
            while view:
                view = view[os.write(pipe, view):]
            os.close(pipe)
        else:
            pipe.write(data)
            pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        if isinstance(pipe, int):
            try:
                os.close(pipe)
            except OSError:
                pass


def own_task_count(uid: int) -> int:
    """Threads of all processes of ``uid`` (what RLIMIT_NPROC counts against)."""
    count = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/status", "rb") as fh:
                count += next((int(line.split()[1]) for line in fh if line.startswith(b"Threads:")), 1)
        except (OSError, ValueError):
            pass
    return count


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _run_processes(run_id: str, uid: int | None, by_environ: bool) -> list[int]:
    """Pids of processes of this run: running under its uid, or (``by_environ``) carrying its id in their
    environment."""
    me, marker = os.getpid(), f"TEXT2GRAD_SANDBOX_RUN={run_id}".encode()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            if uid is not None and os.stat(f"/proc/{pid}").st_uid == uid:
                with open(f"/proc/{pid}/status", "rb") as fh:
                    if any(line.startswith(b"Uid:") and int(line.split()[1]) == uid for line in fh):
                        found.append(pid)
                        continue
            if not by_environ:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(pid)
        except (OSError, ValueError):
            continue
    return found


def kill_run(pgid: int | None, run_id: str, uid: int | None, deadline_s: float = 5.0, by_environ: bool = True) -> int:
    """SIGKILL the process group and every process of the run until none is left; returns survivors."""
    end = time.monotonic() + deadline_s
    while True:
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        alive = [p for p in _run_processes(run_id, uid, by_environ) if not _is_zombie(p)]
        if not alive:
            return 0
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            return len(alive)
        time.sleep(0.01)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


