"""HumanEval+ / MBPP+ release files scored the way EvalPlus scores them, with evalplus's own code, in the sandbox.

A release file (``HumanEvalPlus-v0.1.10.jsonl.gz``, ``MbppPlus-v0.2.0.jsonl.gz``) holds, per task, ``task_id,
prompt, entry_point, canonical_solution, base_input, plus_input, atol, contract`` (HumanEval+ also keeps
HumanEval's base-only ``test``, which EvalPlus does not run). EvalPlus scores a sample by differential testing:

1. the file is read by evalplus's loaders (``get_human_eval_plus`` / ``get_mbpp_plus``, pointed at the local
   file through their ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``), which check the schema and apply
   the per-task input handling (MBPP+ inputs turned back into tuples, sets, complex numbers, ...);
2. the canonical solution runs on every base and plus input (``trusted_exec``, timed): the expected outputs;
3. the sample runs on the same inputs (``untrusted_check``), each input under ``max(1 s, 4 x reference time)``;
   its outputs must equal the expected ones (``atol`` for floats, 1e-6 when the file says 0, and evalplus's
   special oracles). "base" passes when every base input does; "plus" (HumanEval+/MBPP+) when base and plus do.

Steps 2 and 3 run evalplus's functions inside text2grad's sandbox (``evalplus_truth_child.py`` by
`run_python`, ``evalplus_check_child.py`` as the test module of `run_tests`); text2grad never executes the
dataset's or the model's code outside it, and never unpickles what a sandboxed program produced. evalplus is an
optional dependency (``pip install text2grad[offline-eval]``); it is imported here and in the children only.
"""

from __future__ import annotations

import base64
import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from text2grad.core.data import DataError
from text2grad.core.sandbox import run_python

__all__ = ["EVALPLUS_DATASET", "EvalPlusTask", "is_release_record", "load_release", "compute_expected_outputs",
           "check_test_module", "check_files", "check_timeout_s"]

# our benchmark name -> evalplus's dataset name (the one its special oracles key on)
EVALPLUS_DATASET = {"humaneval_plus": "humaneval", "mbpp_plus": "mbpp"}
TRUTH_MARKER = "@@text2grad-evalplus-truth@@"
_HERE = Path(__file__).resolve().parent
_TRUTH_SCRIPT = _HERE / "evalplus_truth_child.py"
_CHECK_MODULE = _HERE / "evalplus_check_child.py"
_TRUTH_TIMEOUT_S = 300.0  # the canonical solutions of the largest HumanEval+ tasks take a few seconds
_TRUTH_OUTPUT_BYTES = 256 << 20  # pickled expected outputs of one task (a few MB for the largest)


def _evalplus():
    """The evalplus modules used here (optional dependency, imported on first use)."""
    try:
        import evalplus.config as config
        import evalplus.data.humaneval as humaneval
        import evalplus.data.mbpp as mbpp
    except ImportError as exc:
        raise DataError(
            f"HumanEval+/MBPP+ release files are scored with the evalplus package ({exc}); "
            "install it with `pip install text2grad[offline-eval]` (or `pip install evalplus==0.3.1`)"
        ) from None
    return config, humaneval, mbpp


def is_release_record(rec: dict[str, Any]) -> bool:
    """A record of an EvalPlus release file (differential testing), as opposed to the HF "original format"."""
    return "base_input" in rec and "plus_input" in rec


@dataclass
class EvalPlusTask:
    """What the sandboxed children need for one task.

    Attributes:
        dataset: evalplus's dataset name ("humaneval" / "mbpp").
        task_blob: base64 pickle, made by the harness, of the task (inputs after evalplus's handling, prompt,
            canonical solution, entry point, atol, time-limit settings).
        n_base / n_plus: number of base / plus inputs.
        expected_blob: base64 pickle of the expected outputs and reference times, as the sandboxed canonical
            run produced it (opaque to the harness); None until `compute_expected_outputs`.
        base_time / plus_time: the reference times in seconds (parsed from JSON, used for the time limits).
    """

    dataset: str
    task_blob: str
    n_base: int
    n_plus: int
    min_time_limit: float
    gt_time_limit_factor: float
    expected_blob: str | None = None
    base_time: list[float] | None = None
    plus_time: list[float] | None = None


def load_release(benchmark: str, path: str | Path) -> list[tuple[dict[str, Any], EvalPlusTask]]:
    """Tasks of a release file through evalplus's own loader: [(record, EvalPlusTask), ...] in file order."""
    config, humaneval, mbpp = _evalplus()
    path = str(Path(path).expanduser())
    if not Path(path).is_file():
        raise DataError(f"data file {path} does not exist")
    dataset = EVALPLUS_DATASET[benchmark]
    module, attribute, loader = (
        (humaneval, "HUMANEVAL_OVERRIDE_PATH", humaneval.get_human_eval_plus) if dataset == "humaneval"
        else (mbpp, "MBPP_OVERRIDE_PATH", mbpp.get_mbpp_plus)
    )
    # evalplus reads the variable once, at import; its loader looks at the module attribute on each call
    saved = getattr(module, attribute)
    setattr(module, attribute, path)
    try:
        tasks = loader(err_incomplete=True)
    except AssertionError as exc:  # evalplus's completeness_check
        raise DataError(f"{path} is not a complete {benchmark} release file: {exc} (evalplus needs prompt, contract, "
                        "canonical_solution, base_input, plus_input and atol in every task)") from None
    except (KeyError, ValueError, TypeError) as exc:
        raise DataError(f"{path}: evalplus could not read it as a {benchmark} release file ({exc!r})") from None
    finally:
        setattr(module, attribute, saved)
    prefix = {"humaneval": "HumanEval/", "mbpp": "Mbpp/"}[dataset]
    strays = [t for t in tasks if not str(t).startswith(prefix)]
    if strays:  # evalplus's oracles and input handling are chosen by dataset: a mix-up would score silently wrong
        raise DataError(f"{path}: task ids {strays[:3]} are not {prefix}N ids; is --benchmark {benchmark} right for this file?")
    out = []
    for task_id, rec in tasks.items():
        if "entry_point" not in rec:
            raise DataError(f"{path}: task {task_id} has no entry_point; it has {sorted(rec)}")
        payload = {key: rec[key] for key in ("prompt", "canonical_solution", "entry_point", "atol", "base_input", "plus_input")}
        payload.update(dataset=dataset, task_id=task_id, min_time_limit=config.DEFAULT_MIN_TIME_LIMIT,
                       gt_time_limit_factor=config.DEFAULT_GT_TIME_LIMIT_FACTOR)
        blob = base64.b64encode(pickle.dumps(payload)).decode("ascii")
        out.append((rec, EvalPlusTask(dataset, blob, len(rec["base_input"]), len(rec["plus_input"]),
                                      config.DEFAULT_MIN_TIME_LIMIT, config.DEFAULT_GT_TIME_LIMIT_FACTOR)))
    return out


def _truth_one(task_id: str, task: EvalPlusTask, memory_mb: int) -> None:
    run = run_python(_TRUTH_SCRIPT.read_text(encoding="utf-8"), files={"evalplus_task.b64": task.task_blob},
                     timeout_s=_TRUTH_TIMEOUT_S, memory_mb=memory_mb, max_output_bytes=_TRUTH_OUTPUT_BYTES)
    line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(TRUTH_MARKER)), None)
    if not run.passed or line is None:
        raise DataError(f"{task_id}: the dataset's canonical solution did not run on its inputs in the sandbox "
                        f"({run.verdict}): {run.stderr.strip()[-600:]}")
    data = json.loads(line[len(TRUTH_MARKER):])
    task.expected_blob = data["expected"]
    task.base_time = [float(t) for t in data["base_time"]]
    task.plus_time = [float(t) for t in data["plus_time"]]


def compute_expected_outputs(tasks: dict[str, EvalPlusTask], *, workers: int = 1, memory_mb: int = 4096) -> None:
    """Run each task's canonical solution on its inputs in the sandbox (once per task) and keep the outputs."""
    todo = [(task_id, t) for task_id, t in tasks.items() if t.expected_blob is None]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(_truth_one, task_id, t, memory_mb) for task_id, t in todo]:
            future.result()


def check_test_module() -> str:
    """The test module (``test_base``, ``test_plus``) that runs evalplus's check of solution.py."""
    return _CHECK_MODULE.read_text(encoding="utf-8")


def check_files(task: EvalPlusTask) -> dict[str, str]:
    """The files the check needs next to solution.py."""
    if task.expected_blob is None:
        raise RuntimeError("compute_expected_outputs must run before the samples are checked")
    return {"evalplus_task.b64": task.task_blob, "evalplus_expected.b64": task.expected_blob}


def check_timeout_s(task: EvalPlusTask, floor_s: float) -> float:
    """A sandbox time limit that never cuts evalplus's own: per check ``min(60, sum of per-input limits)`` + 2 s
    (``untrusted_check``'s join), base and plus in turn, plus start-up; at least ``floor_s``."""
    total = 0.0
    for times in (task.base_time or [], task.plus_time or []):
        limits = sum(max(task.min_time_limit, task.gt_time_limit_factor * t) for t in times)
        total += min(60.0, limits) + 3.0
    return max(floor_s, total + 10.0)
