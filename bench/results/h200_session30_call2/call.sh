#!/usr/bin/env bash
# session 30 call 2: GPU tests of the cuBLASLt choice, then the anchor comparison served with the projections'
# cuBLASLt algorithms chosen at load, and the whole-step A/B of F.linear against them (64/128/256 rows)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 60 python3 bench/cublaslt_ab.py --rows 64 --shapes o,gate_up,down \
  --show 4 > "$out/logs/cublaslt_ab.log" 2>&1
echo "== bench rc $? at ${SECONDS}s"; grep -v Warning "$out/logs/cublaslt_ab.log" | head -30
TRITON_CACHE_DIR=/tmp/triton-tests timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --durations=5 \
  tests/gpu/test_cublaslt_cuda.py tests/gpu/test_runtime_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/logs/gpu_tests.log" | tail -15 | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((570 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 64,256 --profile-rows 256 \
  --levers lt_program_ab,profile \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|lt decode|cuBLASLt|loaded in|kernels, |error|Traceback" "$out/logs/anchor_compare.log" | head -50 | cut -c1-600
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
