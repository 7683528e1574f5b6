#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite. Fails when any test fails
# or when no test ran (pytest exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Two pytest-xdist workers (the CI machine has 2 cores), one test file at a time per worker: a
# file's tests run in their order on one worker, sharing its module fixtures (work stealing could
# run a module's later tests first, which tests that share a served model's caches do not allow).
# Arguments after these win (`-n 0` runs in one process).
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
