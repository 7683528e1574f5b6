#!/usr/bin/env bash
# session 39 call 1: the skinny kernel at 4 and 16 rows (the default prepare's decode buckets) swept wide
# against cuBLAS, every shape's best tile within 5% of cuBLAS handed to the whole-step A/B (committed table
# first), and batches 4 and 16 against the anchor serving with those tiles
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 240 python3 bench/skinny_ab.py --rows 4,16 --wide --adopt-below 1.05 \
  --json "$out/skinny.json" > "$out/skinny_ab.log" 2>&1
echo "== skinny rc $? at ${SECONDS}s"; cut -c1-300 "$out/skinny_ab.log" | grep -v "^  " | head -60; cat "$out/skinny.json"
table=()
[ -s "$out/skinny.json" ] && [ "$(cat "$out/skinny.json")" != "[]" ] && table=(--skinny-table "$out/skinny.json")
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 4,16 --long 16x128x128 --top 15 --anchor-timeout 200 --levers skinny_program_ab \
  --profile-rows 16 --short-profile-rows 16 --step-timing 16 "${table[@]}" --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit|skinny" "$out/anchor_compare.log" | head -50 | cut -c1-400
