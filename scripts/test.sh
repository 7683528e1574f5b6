#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite. Fails when any test fails
# or when no test ran (pytest exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
