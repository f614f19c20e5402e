#!/usr/bin/env bash
# Runs the test suite: `bash scripts/test.sh` (extra arguments go to pytest, e.g. `-m "not slow"`).
# Installs what it needs first (env.sh is idempotent and fast when nothing changed).
# The tests run in pytest-xdist workers, one per core up to 4 (TEXT2GRAD_TEST_WORKERS chooses; 0: one process, e.g.
# for --pdb): many tests launch processes or servers and wait on them. `--dist loadgroup` with tests/conftest.py's
# groups keeps each module's tests on one worker (a module fixture runs once) and every vLLM and GPU test on one worker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source env.sh
# env.sh installed every optional extra, so a test that finds one missing must fail here, not skip (tests/conftest.py)
export TEXT2GRAD_REQUIRE_OPTIONAL="${TEXT2GRAD_REQUIRE_OPTIONAL:-1}"
cores="$(python -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())')"
workers="${TEXT2GRAD_TEST_WORKERS:-$(( cores >= 4 ? 4 : (cores >= 2 ? cores : 0) ))}"
parallel=()
if [ "$workers" -gt 0 ]; then
    parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)  # tests/conftest.py orders the modules
fi
rc=0
python -m pytest ${parallel[@]+"${parallel[@]}"} "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
