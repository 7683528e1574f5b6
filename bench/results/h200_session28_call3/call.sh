#!/usr/bin/env bash
# session 28 call 3: the anchor comparison served with the skinny tiles and the SiLU-mul fused into the gate/up product (64 rows); the
# whole decode step A/B: cuBLAS, skinny, skinny with the SiLU-mul fused (64 and 256 rows);
# the skinny and CUDA-graph runtime GPU tests beside preparation
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 540 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 64,256 --profile-rows 1,64 \
  --levers skinny_program_ab,profile \
  --tests "tests/gpu/test_skinny_cuda.py tests/abi/test_triton_skinny.py tests/gpu/test_runtime_cuda.py" \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|skinny|tests:|kernels, |error|Traceback" "$out/logs/anchor_compare.log" | head -40 | cut -c1-500
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
