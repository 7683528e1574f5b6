#!/usr/bin/env bash
# session 24 call 1: the fused rotary attention's tests on the GPU (8B CUDA-graph check, fixed final comparison),
# then the anchor comparison as served and with the fusion captured
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 110 python3 -m pytest -p no:cacheprovider -n 4 -rA --tb=short tests/abi/test_rotary_attention.py \
  tests/gpu/test_step_calls_cuda.py > "$out/logs/rotary_tests.log" 2>&1
echo "rotary tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^E  " "$out/logs/rotary_tests.log" | head -30
timeout $((585 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --top 30 \
  --anchor-timeout 290 --rotary-fusion both --json "$out/logs/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"; grep -iE "^\| |anchor:|helios |fus|prepared|loaded|error|Traceback" "$out/logs/anchor_compare.log" | head -60
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
