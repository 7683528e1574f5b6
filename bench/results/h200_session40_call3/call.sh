#!/usr/bin/env bash
# session 40 call 3: every gpu-marked test on this tree, then the load A/B (this tree against .anchor/old_src =
# 789c83e's src: before the 4- and 16-row skinny tiles and their kernel variants)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
BUDGET=330 OUT=$out bash bench/gpu_suite.sh 6
echo "== suite done at ${SECONDS}s"
OLD_SRC=.anchor/old_src OUT=$out timeout $((592 - SECONDS)) bash bench/load_ab.sh 1
echo "== load ab done at ${SECONDS}s"
