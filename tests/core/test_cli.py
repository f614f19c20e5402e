"""How a command's process ends: normally in one process, without the interpreter's teardown as a launched rank."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from text2grad.core.cli import is_launched_rank

ROOT = Path(__file__).resolve().parents[2]

# Prints without flushing (a pipe buffers it), registers an exit handler, and keeps an object whose finaliser only
# the interpreter's teardown runs.
PROGRAM = textwrap.dedent("""
    import atexit, sys
    from text2grad.core.cli import exit_process

    class Finalised:
        def __del__(self):
            print("teardown ran", flush=True)

    kept = Finalised()
    atexit.register(lambda: print("exit handler ran"))
    print("work done")
    exit_process(int(sys.argv[1]))
""")


def run_program(code: int, world_size: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    if world_size is not None:
        env["WORLD_SIZE"] = world_size
    return subprocess.run([sys.executable, "-c", PROGRAM, str(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("env, launched", [
    ({"WORLD_SIZE": "2"}, True), ({"WORLD_SIZE": "8"}, True), ({"WORLD_SIZE": "1"}, False), ({}, False),
    ({"WORLD_SIZE": "two"}, False),
])
def test_a_launched_rank_is_one_of_several_processes(env, launched):
    assert is_launched_rank(env) is launched


@pytest.mark.parametrize("code", [0, 3])
def test_a_launched_rank_keeps_its_output_and_exit_handlers_but_skips_the_teardown(code):
    proc = run_program(code, world_size="2")
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.splitlines() == ["work done", "exit handler ran"]


def test_a_single_process_exits_normally_with_its_teardown():
    proc = run_program(2, world_size=None)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == ["work done", "exit handler ran", "teardown ran"]
