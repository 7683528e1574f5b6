#!/usr/bin/env bash
# session 32 call 2: decode attention's fixed cost again with the dependent-launch A/B behind the qkv product
# (bench/decode_fixed_cost.py), then the files holding every gpu-marked test (six xdist workers, a file each)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-fixed timeout 200 python3 bench/decode_fixed_cost.py --contexts 1,64,128,192,256,512 \
  --pdl-contexts 128,256 --json "$out/decode_fixed_cost.json" > "$out/decode_fixed_cost.log" 2>&1
echo "== fixed cost rc $? at ${SECONDS}s"
grep -E "fixed|empty|PDL|Error|error" "$out/decode_fixed_cost.log" | head -40 | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-tests timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rfEs \
  -n 6 --dist loadfile --durations=15 -m gpu $(cat .anchor/gpu_files.txt) > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -25 | cut -c1-300
