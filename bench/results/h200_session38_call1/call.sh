#!/usr/bin/env bash
# session 38 call 1: the skinny kernel's wider tile sweep at 64 rows (block_n 16, block_k 64, two warps, up to
# 2,048 programs), every shape's best tile within 5% of cuBLAS handed to the whole-step A/B (committed table
# first), batches 1 and 64 against the anchor serving with those tiles
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 200 python3 bench/skinny_ab.py --rows 64 --wide --adopt-below 1.05 \
  --json "$out/skinny.json" > "$out/skinny_ab.log" 2>&1
echo "== skinny rc $? at ${SECONDS}s"; cat "$out/skinny_ab.log" | cut -c1-400; cat "$out/skinny.json"
table=()
[ -s "$out/skinny.json" ] && [ "$(cat "$out/skinny.json")" != "[]" ] && table=(--skinny-table "$out/skinny.json")
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1,64 --long 64x128x128 --top 15 --anchor-timeout 200 --levers profile,skinny_program_ab \
  --profile-rows 64 --short-profile-rows 64 --step-timing 64 "${table[@]}" --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|^  +[0-9.]+ ms|loaded in|prepared|TTFT|error|Traceback|anchor: exit|skinny" "$out/anchor_compare.log" | head -70 | cut -c1-300
