#!/usr/bin/env bash
# session 34 call 2: a second draw of the CPU engine (projections through the packed kernel) against transformers
# on the device host's CPU (one thread), then the anchor comparison on the same tree (GPU code unchanged
# this session) with GPU tests beside preparation
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 150 python3 bench/generate_vs_hf.py --repeats 5 --bodies > "$out/cpu_vs_hf.log" 2>&1
echo "== cpu rc $? at ${SECONDS}s"; grep -v Loading "$out/cpu_vs_hf.log" | tail -6 | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 20 --anchor-timeout 250 --rotary-fusion on --step-timing 256 --levers profile \
  --tests "tests/gpu/test_decode_pdl_cuda.py tests/gpu/test_skinny_cuda.py tests/gpu/test_fused_cuda.py -ra -o faulthandler_timeout=250" \
  --json "$out/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|passed|failed|loaded in|prepared|TTFT|error|Traceback" "$out/anchor_compare.log" | head -50 | cut -c1-400
