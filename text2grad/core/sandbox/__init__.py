"""Run untrusted Python (model-generated code, unit tests) in hardened child processes.

Two entry points::

    run_python(code, timeout_s=10, memory_mb=1024)      -> SandboxResult   (a script, its exit status)
    run_tests(solution, tests, timeout_s=10)            -> TestRunResult   (per-test outcomes)

Both return a verdict in {"passed", "failed", "timeout", "crashed", "resource_limit"} and never raise for
anything the program does; they raise only for bad arguments (``ValueError``). ``isolation()`` says which
layers this machine supports.

Modules (one job each): ``api`` (the entry points, the cached probe), ``results`` (result types, verdicts),
``probe`` (which layers the platform allows), ``harness`` (one run: directory, uid, limits, environment,
launch, verdict), ``worker`` (the pre-started worker's client: fd passing, pidfds, kill on timeout),
``processes`` (output sinks, finding and killing a run's processes), and, run BY PATH in the sandboxed
processes with the standard library only, ``bootstrap.py`` (worker loop, namespaces, mounts, rlimits, uid
switch, the program's fresh interpreter state) and ``runner.py`` (the small pytest-like test runner).

Layers (each run; ``result.layers`` lists the ones that applied)
----------------------------------------------------------------
1. ``tempdir``: a fresh directory (``tempfile.mkdtemp``) is the working directory, ``HOME`` and ``TMPDIR``;
   it is deleted afterwards.
2. ``scrubbed-env``: the program sees only PATH, HOME, TMPDIR, LANG/LC_ALL, PYTHONIOENCODING, thread-count
   caps and the run id; API keys and every other variable of the caller are gone. Its interpreter ignores
   PYTHON* variables and the user site directory; its import path is the one ``site`` builds.
3. ``session``: the program starts a new session; on timeout the whole run is SIGKILLed.
4. ``rlimits``: RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (``memory_mb``), RLIMIT_NPROC (``max_processes``; the
   kernel counts threads too), RLIMIT_FSIZE (``max_file_mb``), RLIMIT_NOFILE (256), RLIMIT_CORE (0);
   ``PR_SET_NO_NEW_PRIVS`` so set-uid binaries cannot raise privileges.
5. ``namespaces`` (``unshare --net --mount --pid --ipc --fork --mount-proc --kill-child``, when the ``unshare``
   binary exists and we are root or may create user namespaces): no network (not even loopback: connect
   fails with ENETUNREACH; each run has a network namespace of its own, so runs cannot reach each other
   either, not even through abstract Unix sockets); each run gets its OWN IPC namespace (SysV shared memory, semaphores and message
   queues, which otherwise outlive their creator, die with the run) and its OWN PID namespace whose init is the bootstrap (when it exits or
   is killed, the kernel kills every process left in it; ``os.kill`` of the parent cannot reach the caller)
   and its own private mount namespace in which /proc shows only the run, and /tmp, /var/tmp, /dev/shm and
   /run/lock are fresh size-limited tmpfs mounts (only the run's own directory is bound back), so files the
   program writes outside its directory vanish with it.
6. ``unprivileged-uid`` (when running as root): the program runs under a uid/gid of its own, drawn at random
   from ``0x70000000 + [0, 2**24)`` and owning nothing but its directory. Root ignores RLIMIT_NPROC; a fresh
   uid makes it count only this run's processes (fork bombs hit the limit), makes the rest of the file system
   read-only to the program (it cannot touch root's files or /etc), keeps concurrent runs from signalling
   each other, and lets the cleanup kill every process of that uid. Directories the interpreter needs but
   that others cannot traverse (e.g. a pyenv Python under /root) are replaced by a tmpfs with only those
   paths bound back, which also hides the rest of /root.
7. ``cleanup``: after the run, every process of the run (PID namespace, process group, uid, run id in its
   environment) is SIGKILLed until none is left; ``result.leftover_processes`` counts survivors (0 in every
   test).

How a run starts (``result.launcher``)
--------------------------------------
``"worker"``: a worker started once per network setting, inside the namespaces, as root, with the
bootstrap's imports done and the modules generated code imports most preloaded, forks each run's init
into a fresh PID namespace; the init makes its own mount, IPC and network namespaces, sets up the mounts and
forks the program; the program switches to its fresh uid, applies its limits and runs the code in the
forked interpreter (no new interpreter start). The harness holds the init through a pidfd and SIGKILLs it on
timeout. ``"fresh"``: one ``python bootstrap.py --once`` per run under ``unshare``, the same layers; used when
there are no pidfds, when neither a PID namespace nor the uid switch can account for a run's processes, when
the worker cannot start a run, or with ``TEXT2GRAD_SANDBOX_DISABLE=worker``.

When a layer is not available
-----------------------------
A warning is logged once (logger ``text2grad.core.sandbox``) and the run continues with the other layers:

* no ``unshare`` binary, or it fails (a container without CAP_SYS_ADMIN and no user namespaces): no network
  isolation (``result.network_isolated`` is False: the program can open sockets), no IPC namespace (SysV IPC
  objects a program creates outlive it, visible to later runs), no PID namespace (cleanup
  still kills by uid, process group and run id; a process that calls setsid() and execs with a clean
  environment can escape it when we are not root), and /tmp is shared (the program can create new files in
  world-writable directories).
* not root: no uid switch. RLIMIT_NPROC counts all threads of the calling user, so it is set to their
  current count plus ``max_processes``; the program can read and write whatever the calling user can. With
  user namespaces (``unshare --user --map-root-user``) the network, PID and mount layers still apply.
* root, but the interpreter cannot be made reachable for an unprivileged uid (no mount namespace and a
  Python under a private directory): the program runs as root inside the other layers.

``TEXT2GRAD_SANDBOX_DISABLE=namespaces,setuid,worker`` turns layers (and the worker) off on purpose, for
platforms where they misbehave and for tests of the degraded paths.

What is not covered
-------------------
* Grading honesty: the test runner reports through a private pipe, so nothing the program prints can forge a
  verdict, but code running in the same interpreter as the tests can find that pipe (fd 3) on purpose. The
  sandbox protects the machine, not the honesty of a program written to attack its own grader.
* The kernel: every layer is a Linux kernel feature; no seccomp filter narrows the system calls, so a kernel
  exploit escapes. There is no VM or gVisor boundary. Untrusted code with a budget for kernel 0-days needs one.
* Resources: disk use is bounded per file (RLIMIT_FSIZE) and by time, not by a quota; the private tmpfs
  mounts use RAM outside RLIMIT_AS (at most ``max(64, 4 * max_file_mb)`` MiB each); there is no cgroup, so
  memory is bounded per process (RLIMIT_AS), not per run (up to ``max_processes`` times ``memory_mb``), and
  CPU per process (RLIMIT_CPU) and by the wall-clock timeout.
* Reading: with the uid switch the program reads what "others" may read (world-readable files of the
  machine, e.g. /etc, the Python installation, other users' world-readable data) outside the hidden
  directories; secrets must not be world-readable. Without it, it reads what we can read.
* Runs of one worker share the interpreter's hash seed (the iteration order of a set of strings is the same
  from run to run; ``random`` reseeds in every program).
* The worker's memory is inherited by every program it forks. It holds nothing secret (the harness sends it
  directories, limits, uids and run ids, never code, data or the caller's environment), but a program can find
  the specs of earlier runs there.
* Degraded platforms: see "When a layer is not available".
"""

from __future__ import annotations

from .api import isolation, run_python, run_tests
from .bootstrap import plan_mounts
from .probe import Isolation
from .results import SandboxResult, TestOutcome, TestRunResult, Verdict
from .worker import shutdown_workers

__all__ = [
    "Verdict",
    "SandboxResult",
    "TestOutcome",
    "TestRunResult",
    "Isolation",
    "isolation",
    "run_python",
    "run_tests",
    "plan_mounts",
    "shutdown_workers",
]
