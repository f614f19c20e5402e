#!/usr/bin/env bash
# Runs the test suite: `bash scripts/test.sh` (extra arguments go to pytest, e.g. `-m "not slow"`).
# Installs what it needs first (env.sh is idempotent and fast when nothing changed).
# The tests run in parallel pytest-xdist workers, one per core up to 4 (TEXT2GRAD_TEST_WORKERS chooses; 0 runs them
# in this one process, as `-n 0` or `--pdb` need): much of the suite waits on launched processes and servers, and
# `--dist loadgroup` with tests/conftest.py's groups keeps each module's tests on one worker and every vLLM and GPU
# test on one worker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source env.sh
cores="$(python -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())')"
workers="${TEXT2GRAD_TEST_WORKERS:-$(( cores >= 4 ? 4 : (cores >= 2 ? cores : 0) ))}"
parallel=()
if [ "$workers" -gt 0 ]; then
    parallel=(-n "$workers" --dist loadgroup)
fi
rc=0
python -m pytest ${parallel[@]+"${parallel[@]}"} "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
