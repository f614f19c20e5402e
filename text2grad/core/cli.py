"""One ``main`` for every command line of the project (``text2grad <command>`` and each ``python -m ...``).

Each entry point is ``def main(argv=None) -> int: return run_cli(TheConfig, run, argv)``, where ``run(cfg)`` does
the work. `run_cli` owns what every command must do the same way:

- parse ``--config file.yaml`` and ``--<field> value`` flags into the config dataclass
  (`text2grad.core.config.parse_config`: no abbreviated flags, grouped ``--help``, ``--version``,
  ``--log_level``), validating every value before ``run`` starts, so before any model loads;
- user errors (bad values, missing or existing files, bad data) print ``error: <what and how to fix it>`` on
  stderr and exit 2; a run whose work mostly failed (`RunFailed`) prints ``error: <cause>`` and exits 1;
  Ctrl-C exits 130;
- ``text2grad --help | head`` ends quietly instead of with a BrokenPipeError.

Exit codes, everywhere: 0 done, 1 the work failed (the message names the cause), 2 usage or input error,
3 stopped on NaN/inf (PPO), 130 interrupted.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping, Sequence

from text2grad.core.config import ConfigError, DataError, parse_config

__all__ = [
    "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NONFINITE", "EXIT_OK", "EXIT_USAGE", "RunFailed", "USER_ERRORS",
    "exit_process", "hide_gpus_for_cpu_ranks", "is_launched_rank", "print_error", "quiet_broken_pipe", "run_cli",
    "stale_extension_locks", "warn_stale_extension_locks",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NONFINITE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
_EXIT_BROKEN_PIPE = 141  # what a shell reports for a program killed by SIGPIPE

# Exceptions that mean the user asked for something impossible (the message says what and how to fix it).
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, DataError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
)


class RunFailed(RuntimeError):
    """The run did not do its work (e.g. every request failed): exit 1 with this message as the cause."""

    exit_code = EXIT_FAILED


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, the one error format of every command."""
    print(f"error: {message}", file=sys.stderr)


def quiet_broken_pipe() -> None:
    """Flush stdout; if the reader has gone (``| head``), send the rest to /dev/null so Python's own flush at
    exit does not print a BrokenPipeError traceback."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    except ValueError:  # stdout already closed
        pass


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (e.g. captured by a test)
        pass


def guarded(main: Callable[[], int]) -> int:
    """Run ``main()`` with the shared error handling (user errors -> 2, `RunFailed` -> 1, Ctrl-C -> 130,
    broken pipe -> quiet). For dispatchers that parse their own arguments; `run_cli` uses it too."""
    try:
        try:
            return int(main() or 0)
        except USER_ERRORS as exc:
            print_error(str(exc))
            return EXIT_USAGE
        except RunFailed as exc:
            print_error(str(exc))
            return exc.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            quiet_broken_pipe()
    except BrokenPipeError:
        _stdout_to_devnull()
        return _EXIT_BROKEN_PIPE


def is_launched_rank(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a multi-process launch (torchrun, ``accelerate launch`` and
    ``deepspeed`` all set ``WORLD_SIZE``). A malformed value counts as one process: the run itself has already
    refused it (`text2grad.core.placement.world_size`, which this module does not import: it loads torch, and the
    command list must print without it)."""
    value = (os.environ if env is None else env).get("WORLD_SIZE") or "1"
    try:
        return int(value) > 1
    except ValueError:
        return False


def exit_process(code: int, env: Mapping[str, str] | None = None) -> None:
    """End a command-line process with ``code``: the ``if __name__ == "__main__"`` line of every command that a
    launcher starts as several ranks.

    A single process exits normally (`sys.exit`). A launched rank runs the interpreter's exit handlers (loggers,
    trackers, temporary files) and flushes its streams, then leaves with `os._exit`, skipping the interpreter's
    final teardown: a distributed backend's worker threads can still hold tensors then, and releasing them while the
    interpreter is half torn down aborts the rank ("terminate called without an active exception", SIGABRT) after
    its work is done and saved, which fails the whole launch. The process group itself is left by
    `text2grad.core.modeling.end_distributed` before this.
    """
    if not is_launched_rank(env):
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or the reader has gone
                pass
        os._exit(code)


def hide_gpus_for_cpu_ranks(env: MutableMapping[str, str] | None = None) -> bool:
    """Hide the GPUs from this process when DeepSpeed is asked for CPU ranks (``DS_ACCELERATOR=cpu``).

    DeepSpeed's launcher writes ``CUDA_VISIBLE_DEVICES=0,...,n-1`` into every rank's environment even for its CPU
    accelerator, so on a GPU machine each CPU rank would see the GPUs: torch and accelerate would place it on one
    (and `check_process_gpus` refuse more ranks than GPUs) while DeepSpeed communicates over the CPU. Clearing the
    variable before CUDA starts makes every library agree on the CPU; every command's `run_cli` calls this first.

    Returns whether ``env`` (default ``os.environ``) was changed.
    """
    env = os.environ if env is None else env
    if env.get("DS_ACCELERATOR") != "cpu" or env.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    env["CUDA_VISIBLE_DEVICES"] = ""
    return True


STALE_LOCK_AGE_S = 600.0  # compiling one of DeepSpeed's CPU ops takes well under a minute


def stale_extension_locks(env: Mapping[str, str] | None = None, now: float | None = None,
                          max_age_s: float = STALE_LOCK_AGE_S) -> list[tuple[Path, float]]:
    """Build locks of torch C++ extensions older than ``max_age_s``, as ``(path, age in seconds)``, oldest first.

    DeepSpeed compiles some ops on first use (on the CPU, the ``deepspeed_shm_comm`` op of its communication) under
    ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions/py<XY>_<accelerator>``), and torch serialises the
    build with a file ``<op>/lock`` that waiting processes poll. A build whose process was killed (out of memory,
    Ctrl-C at the wrong moment) leaves the file behind, and every later DeepSpeed run then waits on it forever.
    ``env`` and ``now`` default to the real ones, so a test gives any directory and clock.
    """
    env = os.environ if env is None else env
    cache = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")  # as torch finds it
    root = Path(env["TORCH_EXTENSIONS_DIR"]) if env.get("TORCH_EXTENSIONS_DIR") else cache / "torch_extensions"
    now = time.time() if now is None else now
    stale = []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:  # <root>/<op>/lock with the variable set, else deeper
        try:
            age = now - lock.stat().st_mtime
        except OSError:  # removed by the build that held it
            continue
        if age > max_age_s:
            stale.append((lock, age))
    return sorted(stale, key=lambda item: -item[1])


def warn_stale_extension_locks(env: Mapping[str, str] | None = None, now: float | None = None) -> list[Path]:
    """Under DeepSpeed (``ACCELERATE_USE_DEEPSPEED=true`` or ``DS_ACCELERATOR`` set), print a warning on stderr for
    each stale build lock (`stale_extension_locks`), with the command that removes it, from the first process of
    each machine only. Returns the locks warned about. Nothing is removed: a lock is only very probably stale."""
    env = os.environ if env is None else env
    under_deepspeed = env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" or bool(env.get("DS_ACCELERATOR"))
    if not under_deepspeed or env.get("LOCAL_RANK", "0") != "0":
        return []
    stale = stale_extension_locks(env, now)
    for lock, age in stale:
        print(f"warning: {lock} is {age / 60:.0f} minutes old: a torch extension build that was killed leaves this "
              "lock behind, and DeepSpeed then waits on it forever while it compiles the op. If no build is running, "
              f"remove it (rm {lock}) and start again.", file=sys.stderr)
    return [lock for lock, _ in stale]


def run_cli(
    config_cls: type,
    run: Callable[[Any], int | None],
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) into ``config_cls`` and return ``run(cfg)``'s exit code (None
    counts as 0), with the shared error handling of `guarded`. ``--help`` and argument errors exit from the
    parser (SystemExit 0 and 2). Under DeepSpeed's CPU accelerator the GPUs are hidden first
    (`hide_gpus_for_cpu_ranks`), and a stale build lock of DeepSpeed's compiled ops is named with its fix
    (`warn_stale_extension_locks`)."""
    hide_gpus_for_cpu_ranks()
    warn_stale_extension_locks()
    return guarded(lambda: run(parse_config(config_cls, argv, description=description)))
