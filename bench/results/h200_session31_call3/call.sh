#!/usr/bin/env bash
# session 31 call 3: the first 256-row run after load under the step timing, collections logged, heap not frozen
# comparison at batch 256 with Helios served again with and without a pause between prefill and decode
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
echo "== start at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((560 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 256 --anchor-timeout 200 --rotary-fusion on --step-timing 256 --levers "" --short-profile-rows "" \
  --gemm-algos off --rested-decode 3 --first-step-timing --freeze-heap off \
  --json "$out/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== compare done at ${SECONDS}s"
grep -iE "^\| |pause|first run|collections|step timing|loaded in|clocks|error|Traceback" "$out/anchor_compare.log" | head -40 | cut -c1-400
