#!/usr/bin/env bash
# session 41 call 4: as call 3, with the step timing's mean, p10/p90 and first-start-to-last-end span of the full steps
# alone, sustained) and each side's step over it
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 420 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 256 --long 16x128x128 --top 12 --anchor-timeout 250 --levers none \
  --profile-rows 256 --short-profile-rows "" --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|error|Traceback|anchor: exit|clocks" "$out/anchor_compare.log" | head -40 | cut -c1-400
timeout $((590 - SECONDS)) python3 bench/power_floor.py --rows 256 --sustain-s 4 --rounds 3 --anchor-json "$out/anchor_compare.json" 2>&1 | tee "$out/power_floor.log"
echo "== done at ${SECONDS}s"
