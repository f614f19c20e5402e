"""Sandbox child (run by path as a script, never imported by text2grad): EvalPlus's expected outputs for one task.

EvalPlus computes the expected outputs by running the canonical solution on every base and plus input with its
own ``evalplus.gen.util.trusted_exec`` (timed, so the sample's per-input time limits scale with it). Here that
same call runs inside text2grad's sandbox: the dataset file is input from outside, so its code is not trusted
by the harness either. The outputs go back pickled and base64-encoded after a marker line; the harness never
unpickles them, it only hands them to the sandboxed check of each sample (``evalplus_check_child.py``).
Stdlib + evalplus only.
"""

import base64
import json
import pickle
import sys

from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
from evalplus.gen.util import trusted_exec

MARKER = "@@text2grad-evalplus-truth@@"

with open("evalplus_task.b64", "rb") as fh:
    task = pickle.loads(base64.b64decode(fh.read()))

# evalplus.evaluate.get_groundtruth: MBPP+ tasks whose outputs cannot be compared keep only "is not None"
not_none = MBPP_OUTPUT_NOT_NONE_TASKS if task["dataset"] == "mbpp" else []
program = task["prompt"] + task["canonical_solution"]
oracle = {}
for kind in ("base", "plus"):
    oracle[kind], oracle[f"{kind}_time"] = trusted_exec(
        program, task[f"{kind}_input"], task["entry_point"], record_time=True,
        output_not_none=task["entry_point"] in not_none,
    )
blob = base64.b64encode(pickle.dumps(oracle)).decode("ascii")
sys.stdout.flush()
sys.stdout.write("\n" + MARKER + json.dumps({"base_time": oracle["base_time"], "plus_time": oracle["plus_time"],
                                             "expected": blob}) + "\n")
sys.stdout.flush()
