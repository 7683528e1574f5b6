#!/usr/bin/env bash
# Issue 18, GPU decode levers at the compiled anchor's shapes, in one device call on one H200 (at most
# BUDGET seconds, default 226), logs under $OUT. The second call, after the first
# (bench/results/h200_decode_gpu_call1: the sweep whose tiles DECODE_TILES and GEMV_TILES now hold):
#   1. bench/greedy_ab.py: the greedy sampling pass at 1/64/256 rows of the 8B vocabulary, the float32
#      reduction of neutral rows against the float64 one (the kernel before it) and split counts;
#   2. bench/decode_step_profile.py: a 2-layer 8B-shaped core served at batch 1 and 256 (128-token
#      prompts), ms per engine step once every prompt is in, the kernels of one decode step at each by
#      kind, and the greedy step as captured (GEMV table applied) against the same step all on cuBLAS,
#      from the same buffers (outputs compared); a host profile (cProfile) of the batch-256 serving;
#   3. bench/decode_attention.py: the served tiles (the adopted table, "new") against the previous
#      defaults (64x4x2x128x1 and 128x8x2x128x1, swept) at batches 1/64/256 x contexts 128/256/1024;
#   4. GPU tests (pytest -n 6) of the decode kernels, the GEMV and the greedy pass: splits, tiles, GQA,
#      windows, sinks, the fused combine replayed from a CUDA graph at 8B shapes (the adopted tiles
#      among them), kN and speculative programs, outputs written without a zero fill (NaN-poisoned),
#      the ops in a CUDA graph, the GEMV and its capture-time binding, the greedy pass's float32 rows.
# The sm_90 compile checks run on the CPU (tests/abi/compile_attention_kernels.py, compile_fused_kernels.py).
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

timeout "$(limit 35)" python3 bench/greedy_ab.py --rows 1,64,256 > "$out/greedy_ab.log" 2>&1
echo "greedy: exit $? at ${SECONDS}s"

timeout "$(limit 55)" python3 bench/decode_step_profile.py --layers 2 --batches 1,256 --output 64 \
  --json "$out/decode_step_profile.json" > "$out/decode_step_profile.log" 2>&1
echo "step profile: exit $? at ${SECONDS}s"

timeout "$(limit 40)" python3 bench/decode_attention.py --batches 1,64,256 --contexts 128,256,1024 \
  --tiles 64x4x2x128x1,128x8x2x128x1 --splits 1,33 --warmup 2 --rep 12 --jobs 14 \
  --json "$out/decode_attention.json" > "$out/decode_attention.log" 2>&1
echo "decode attention: exit $? at ${SECONDS}s"

timeout "$(limit 90)" python3 -m pytest -q -p no:cacheprovider -n 6 -ra -k "not compile_for_hopper" \
  tests/abi/test_triton_decode.py tests/abi/test_triton_decode_combine.py tests/abi/test_triton_decode_heads.py \
  tests/abi/test_attention_sinks.py tests/abi/test_triton_gemv.py tests/abi/test_triton_sampling.py \
  tests/abi/test_triton_attention.py > "$out/gpu_tests.log" 2>&1
echo "tests: exit $? at ${SECONDS}s: $(tail -1 "$out/gpu_tests.log")"

echo "== summary"
grep -E "^greedy R=" "$out/greedy_ab.log"
grep -E "^SUMMARY|^helios" "$out/decode_step_profile.log"
grep -A18 "^host profile" "$out/decode_step_profile.log" | grep -v "^$" | head -16
grep -A12 "^summary (us)" "$out/decode_attention.log"
grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -3
echo "[done at ${SECONDS}s]"
