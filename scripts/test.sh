#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite. Fails when any test fails
# or when no test ran (pytest exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Two pytest-xdist workers (the CI machine has 2 cores); work stealing keeps the long files from
# leaving one worker with a tail. Arguments after these win (`-n 0` runs in one process).
.venv/bin/python -m pytest -q -n 2 --dist worksteal "$@"
