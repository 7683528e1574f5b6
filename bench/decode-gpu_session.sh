#!/usr/bin/env bash
# Issue 18, GPU decode levers at the compiled anchor's shapes, in one device call on one H200 (at most
# BUDGET seconds, default 226), logs under $OUT:
#   1. GPU tests of the decode kernels and the GEMV (pytest -n 6): splits, tiles, GQA, windows, sinks,
#      the fused combine replayed from a CUDA graph at 8B shapes, the partly wide (kN) programs and the
#      output written without a zero fill (NaN-poisoned outputs, padding tokens), the ops in a CUDA
#      graph, the Triton GEMV against F.linear and its capture-time binding;
#   2. bench/decode_attention.py at batches 1/64/256 x contexts 128/256/1024 in one process: the
#      previous kernel, the served kernel after a zero fill (as before this branch), the served kernel,
#      and the sweep (tiles, kN heads per program, prefetch, split counts), with suggested table entries;
#   3. bench/decode_step_profile.py: a 2-layer 8B-shaped core served at batch 1 and 256 (128-token
#      prompts), the kernels of one decode step at each, per layer by kind, and the greedy step as
#      captured (GEMV table applied) against the same step all on cuBLAS;
#   4. bench/gemv_ab.py: cuBLAS against the Triton GEMV's tiles at the 8B projection shapes, one row,
#      distinct weights per call (no L2 reuse), and the GEMV_TILES entries to adopt.
# Run from the repository root:  OUT=dir bash bench/decode-gpu_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
budget=${BUDGET:-226}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 5)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 5 ? left : 5) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

# (the sm_90 compile check runs on the CPU: tests/abi/compile_attention_kernels.py, not here)
timeout "$(limit 55)" python3 -m pytest -q -p no:cacheprovider -n 6 -ra -k "not compile_for_hopper" \
  tests/abi/test_triton_decode.py tests/abi/test_triton_decode_combine.py tests/abi/test_triton_decode_heads.py \
  tests/abi/test_attention_sinks.py tests/abi/test_triton_attention.py tests/abi/test_triton_gemv.py \
  > "$out/gpu_tests.log" 2>&1
echo "tests: exit $? at ${SECONDS}s: $(tail -1 "$out/gpu_tests.log")"

timeout "$(limit 85)" python3 bench/decode_attention.py --batches 1,64,256 --contexts 128,256,1024 \
  --warmup 2 --rep 12 --jobs 14 --json "$out/decode_attention.json" > "$out/decode_attention.log" 2>&1
echo "decode attention: exit $? at ${SECONDS}s"

timeout "$(limit 62)" python3 bench/decode_step_profile.py --layers 2 --batches 1,256 --output 32 \
  --json "$out/decode_step_profile.json" > "$out/decode_step_profile.log" 2>&1
echo "step profile: exit $? at ${SECONDS}s"

timeout "$(limit 25)" python3 bench/gemv_ab.py --rows 1 --tiles 8x512x4,4x512x4,16x512x4,8x1024x4,16x256x4,32x256x8 > "$out/gemv_ab.log" 2>&1
echo "gemv: exit $? at ${SECONDS}s"

echo "== summary"
grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -3
grep -A12 "^summary (us)" "$out/decode_attention.log"
grep -E "^suggested|served with" "$out/decode_attention.log"
grep -E "^GEMV R=1,|^adopt" "$out/gemv_ab.log"
grep -E "^SUMMARY|^helios" "$out/decode_step_profile.log"
echo "[done at ${SECONDS}s]"
