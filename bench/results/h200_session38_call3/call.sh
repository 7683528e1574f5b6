#!/usr/bin/env bash
# session 38 call 3: the skinny kernel at one row (block_m 16; PDL, its weight rows prefetched into L2 before
# the previous kernel ends, the SiLU-mul in the gate/up epilogue) swept wide against cuBLAS, every shape's best
# tile within 5% of cuBLAS handed to the whole-step A/B (committed table first; 64 rows as the control), and
# batch 1 against the anchor serving with those tiles
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 200 python3 bench/skinny_ab.py --rows 1 --wide --adopt-below 1.05 \
  --json "$out/skinny.json" > "$out/skinny_ab.log" 2>&1
echo "== skinny rc $? at ${SECONDS}s"; cut -c1-400 "$out/skinny_ab.log"; cat "$out/skinny.json"
table=()
[ -s "$out/skinny.json" ] && [ "$(cat "$out/skinny.json")" != "[]" ] && table=(--skinny-table "$out/skinny.json")
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 1 --long 64x128x128 --top 15 --anchor-timeout 200 --levers profile,skinny_program_ab \
  --profile-rows 1 --short-profile-rows 1 --step-timing 1 "${table[@]}" --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit|skinny" "$out/anchor_compare.log" | head -50 | cut -c1-400
