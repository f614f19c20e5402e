#!/usr/bin/env bash
# Runs the test suite: `bash scripts/test.sh` (extra arguments go to pytest, e.g. `-m "not slow"`).
# Installs what it needs first (env.sh is idempotent and fast when nothing changed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source env.sh
# env.sh installed every optional extra, so a test that finds one missing must fail here, not skip (tests/conftest.py)
export TEXT2GRAD_REQUIRE_OPTIONAL="${TEXT2GRAD_REQUIRE_OPTIONAL:-1}"
rc=0
python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
