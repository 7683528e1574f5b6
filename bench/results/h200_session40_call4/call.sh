#!/usr/bin/env bash
# session 40 call 4: every gpu-marked test on this tree with a longer budget (call 3's ran out at 330 s on a
# cold Triton cache, 92% through with no failure)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
BUDGET=480 OUT=$out bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
