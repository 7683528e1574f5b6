#!/usr/bin/env bash
# session 37 call 1: the greedy graph sampling the head's bfloat16 product (no float32 copies): its GPU tests,
# then batch 256 against the anchor in one call (gemm algos off as served), the served greedy graph profiled,
# and the same-process A/B of the greedy graph before/after (product_program_ab) at 64 and 256 rows
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_greedy_rows_cuda.py tests/abi/test_triton_sampling.py \
  tests/abi/test_sampling_rows.py > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"; tail -3 "$out/gpu_tests.log"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((585 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --batches 256 --long 64x128x128 --top 15 --anchor-timeout 200 --levers profile,product_program_ab \
  --profile-rows 256 --short-profile-rows 256 --step-timing 256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|served greedy|^  +[0-9.]+ ms|loaded in|prepared|TTFT|error|Traceback|anchor: exit|product decode" "$out/anchor_compare.log" | head -60 | cut -c1-300
