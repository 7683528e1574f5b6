#!/usr/bin/env bash
# session 46 call 4: every gpu-marked test on this tree (the suite last ran whole in session 40)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
BUDGET=540 OUT=$out bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
