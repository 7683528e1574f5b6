#!/usr/bin/env bash
# session 37 call 3: batches 1 and 64 against the anchor in one call (gemm algos off, as served), the greedy
# graph's A/B (product_program_ab) at 1 and 64 rows
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 560 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1,64 --long 64x128x128 --top 15 --anchor-timeout 200 --levers profile,product_program_ab \
  --profile-rows 64 --short-profile-rows 64 --step-timing 64 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|^  +[0-9.]+ ms|loaded in|prepared|TTFT|error|Traceback|anchor: exit|product decode" "$out/anchor_compare.log" | head -60 | cut -c1-300
