#!/usr/bin/env bash
# session 40 call 1: the GPU skinny tests with the 4-row gate/up tile that fuses the SiLU-mul (16x128x128/1w8s5,
# tied with 16x16x128/1w2s6 alone), the whole-step A/B at 4 and 16 rows with it, and batches 4 and 16 served
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 580 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 4,16 --long 16x128x128 --top 15 --anchor-timeout 200 --levers skinny_program_ab \
  --tests "tests/gpu/test_skinny_cuda.py" \
  --profile-rows 4 --short-profile-rows 4 --step-timing 4 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|loaded in|prepared|TTFT|error|Traceback|anchor: exit|skinny|passed|failed" "$out/anchor_compare.log" | head -60 | cut -c1-500
