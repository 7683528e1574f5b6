#!/usr/bin/env bash
# session 29 call 2: GPU tests of dependent launch (same bits), then the anchor comparison served with the
# norm and skinny kernels under programmatic dependent launch, and the whole-step A/B without and with it
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 130 python3 -m pytest -q -p no:cacheprovider -rfE --durations=5 \
  tests/gpu/test_skinny_cuda.py tests/gpu/test_fused_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/logs/gpu_tests.log" | tail -15 | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 420 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 64,256 --profile-rows 64 \
  --levers pdl_program_ab,profile \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|pdl|tests:|kernels, |error|Traceback" "$out/logs/anchor_compare.log" | head -40 | cut -c1-600
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
