#!/usr/bin/env bash
# session 32 call 3: the anchor comparison as served with the decode attention under dependent launch; the
# whole-step A/B of dependent launch at 1/64/256 rows; GPU tests beside preparation (the new PDL test,
# the Engram graph load the dry-run fix repairs, vision with openai carried)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 20 --anchor-timeout 250 --rotary-fusion on --step-timing 256 --levers pdl_program_ab \
  --tests "tests/gpu/test_decode_pdl_cuda.py tests/gpu/test_host_staging_cuda.py tests/gpu/test_vision_cuda.py tests/gpu/test_skinny_cuda.py -ra -o faulthandler_timeout=250" \
  --json "$out/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|pdl|dependent|passed|failed|loaded in|prepared|TTFT|error|Traceback" "$out/anchor_compare.log" | head -50 | cut -c1-400
