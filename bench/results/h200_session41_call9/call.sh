#!/usr/bin/env bash
# session 41 call 9: as call 7, the step buffer's token ids filled with random ids (one per row) before the profiled replays
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 450 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 256 --long 16x128x128 --top 14 --anchor-timeout 250 --levers profile --sustain-ms 1000 \
  --profile-rows 256 --short-profile-rows "" --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |distinct|step timing|served greedy|^  +[0-9.]+ ms|loaded in|prepared|error|Traceback|anchor: exit" "$out/anchor_compare.log" | head -70 | cut -c1-400
timeout $((590 - SECONDS)) python3 bench/power_floor.py --rows 256 --sustain-s 3 --rounds 2 --anchor-json "$out/anchor_compare.json" 2>&1 | tee "$out/power_floor.log"
echo "== done at ${SECONDS}s"
