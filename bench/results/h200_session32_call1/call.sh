#!/usr/bin/env bash
# session 32 call 1: decode attention's fixed cost per call (bench/decode_fixed_cost.py), then every
# gpu-marked test of the suite (pytest -m gpu, six xdist workers, one file per worker at a time)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-fixed timeout 170 python3 bench/decode_fixed_cost.py --json "$out/decode_fixed_cost.json" \
  > "$out/decode_fixed_cost.log" 2>&1
echo "== fixed cost rc $? at ${SECONDS}s"
grep -E "fixed|empty|Error|error" "$out/decode_fixed_cost.log" | head -20 | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-tests timeout $((585 - SECONDS)) python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  -n 6 --dist loadfile --durations=15 tests > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -25 | cut -c1-300
