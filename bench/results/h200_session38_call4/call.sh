#!/usr/bin/env bash
# session 38 call 4: every gpu-marked test with the one-row skinny tiles committed, then batch 1 against the
# anchor as served (the committed table, no --skinny-table)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
BUDGET=330 OUT=$out bash bench/gpu_suite.sh 6
echo "== suite at ${SECONDS}s"; grep -E "test_skinny_cuda" "$out/gpu_tests.log" | head -5
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((575 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1 --long 64x128x128 --top 15 --anchor-timeout 150 --levers profile \
  --profile-rows 1 --short-profile-rows 1 --step-timing 1 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit" "$out/anchor_compare.log" | head -30 | cut -c1-300
