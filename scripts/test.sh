#!/usr/bin/env bash
# Runs the test suite: `bash scripts/test.sh` (extra arguments go to pytest, e.g. `-m "not slow"`).
# Installs what it needs first (env.sh is idempotent and fast when nothing changed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source env.sh
rc=0
python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
