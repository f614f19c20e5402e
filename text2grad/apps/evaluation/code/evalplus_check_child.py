"""Sandbox child (the test module of one `run_tests` call, never imported by text2grad): EvalPlus's own check.

``test_base`` and ``test_plus`` call ``evalplus.eval.untrusted_check`` exactly as ``evalplus.evaluate``'s
``check_correctness`` does (fast check, default time limits): the program in solution.py runs on every base /
plus input in evalplus's forked worker, and its outputs are compared with the canonical solution's (exact, or
``atol`` / 1e-6 for floats, and evalplus's per-task oracles: set equality, "not None", ``find_zero``'s
``_poly``, ...). Everything here runs inside text2grad's sandbox; evalplus's ``reliability_guard`` is an extra
layer inside it. Stdlib + evalplus only.
"""

import base64
import os
import pickle

# evalplus would set RLIMIT_AS to 4 GiB (never above the machine's RAM); the sandbox's own limit already holds
# and cannot be raised from inside, so evalplus's is turned off (-1) rather than failing to raise it
os.environ["EVALPLUS_MAX_MEMORY_BYTES"] = "-1"

from evalplus.eval import PASS, untrusted_check  # noqa: E402 - after the environment it reads


def _load(name):
    with open(name, "rb") as fh:
        return pickle.loads(base64.b64decode(fh.read()))


TASK = _load("evalplus_task.b64")
EXPECTED = _load("evalplus_expected.b64")
with open("solution.py", encoding="utf-8") as fh:
    PROGRAM = fh.read()


def _check(kind):
    inputs = TASK[f"{kind}_input"]
    status, details = untrusted_check(
        TASK["dataset"], PROGRAM, inputs, TASK["entry_point"], expected=EXPECTED[kind], atol=TASK["atol"],
        ref_time=EXPECTED[f"{kind}_time"], fast_check=True,
        min_time_limit=TASK["min_time_limit"], gt_time_limit_factor=TASK["gt_time_limit_factor"],
    )
    if status == PASS:
        return
    details = list(details)
    if details and not details[-1]:  # fast check stops at the first failing input
        i = len(details) - 1
        raise AssertionError(f"evalplus {kind} status {status!r} on {kind} input #{i} of {len(inputs)}: {inputs[i]!r}"[:400])
    raise AssertionError(f"evalplus {kind} status {status!r} after {len(details)} of {len(inputs)} {kind} inputs "
                         "(the program failed to load, or ran out of time)")


def test_base():
    _check("base")


def test_plus():
    _check("plus")
