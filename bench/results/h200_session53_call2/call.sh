#!/usr/bin/env bash
# session 53 call 2: batches 1, 64 and 256 against the anchor in the same call (row-blocked draws, cache released before capture)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 570 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1,64,256 --long 16x128x128 --top 12 --anchor-timeout 300 --levers none \
  --profile-rows 256 --short-profile-rows "" --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |working set|capture needs|after load|step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit|clocks" "$out/anchor_compare.log" | head -60 | cut -c1-500
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
