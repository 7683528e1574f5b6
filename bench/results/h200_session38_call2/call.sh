#!/usr/bin/env bash
# session 38 call 2: every gpu-marked test with the output projection's skinny tile committed (64 rows), then
# batch 256 against the anchor (gemm algos off, as served) with the served greedy graph profiled
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
BUDGET=320 OUT=$out bash bench/gpu_suite.sh 6
echo "== suite at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((592 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 256 --long 64x128x128 --top 15 --anchor-timeout 200 --levers profile \
  --profile-rows 256 --short-profile-rows 256 --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit" "$out/anchor_compare.log" | head -40 | cut -c1-300
