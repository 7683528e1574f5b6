#!/usr/bin/env bash
# session 53 call 3 (asks an H100): the 8B core's default load (fraction 0.85) with session 52's capture, then with row-blocked draws/logprobs and the cache released before each capture (each its own process and cold Triton cache); then the anchor draw in the time left
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
filter() { grep -v "checkpoint: layer\|DEBUG\|FutureWarning\|isinstance(treespec\|captured "; }
TRITON_CACHE_DIR=/tmp/triton-old timeout 170 python3 .anchor/load_memory_old.py --memory-fraction 0.85 --top 12 --device-gib 79.18 2>&1 | filter > "$out/load_memory_old.log"
echo "== old done at ${SECONDS}s"
grep -E "before capture|after capture|loaded in|load failed|out of memory allocating|again" "$out/load_memory_old.log" | tail -12 | cut -c1-250
TRITON_CACHE_DIR=/tmp/triton-new timeout 150 python3 bench/load_memory.py --memory-fraction 0.85 --top 12 --device-gib 79.18 2>&1 | filter > "$out/load_memory_new.log"
echo "== new done at ${SECONDS}s"
grep -E "before capture|after capture|loaded in|load failed|out of memory allocating|again" "$out/load_memory_new.log" | tail -12 | cut -c1-250
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((585 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1,64,256 --long 16x128x128 --top 12 --anchor-timeout 300 --levers none \
  --profile-rows 256 --short-profile-rows "" --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |after load|step timing|loaded in|prepared|TTFT|error|Traceback|anchor: exit|clocks helios (1|64|256) " "$out/anchor_compare.log" | head -30 | cut -c1-400
