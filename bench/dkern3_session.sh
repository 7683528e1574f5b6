#!/usr/bin/env bash
# Issue 18, the per-layer launches of the captured decode step, in one device call on one H200 (at most
# BUDGET seconds, default 195), logs under $OUT:
#   1. GPU tests (pytest -n 6, failures printed short): helios::rotary_paged_attention (the decode kernel
#      with its rotary prologue) against the two-kernel sequence at 8B shapes replayed from CUDA graphs
#      (batch 1/7/64/256, tuned split counts 1/3/16, with and without the L2 prefetch) and the
#      interpreter-level cases compiled (the first call, bench/results/dkern3_call1, ran these beside the
#      decode head tests and was cut off before pytest printed its failures);
#   2. bench/rotary_attention_ab.py: per layer at 8B attention shapes, rotary cache write + tuned decode
#      attention (two launches) against the fused launch, batches 1/64/256 x contexts 128/256; then each
#      followed by the layer's output projection (distinct weights), the fused launch with and without the
#      L2 prefetch of that weight by extra programs of its grid;
#   3. bench/decode_step_profile.py: a 4-layer 8B-shaped core served at batch 1 and 64 (ms per engine step),
#      the kernels of one decode step (per layer), the captured greedy step with the fused calls against the
#      same graph with the pairs split and with the o weight's L2 prefetch (same buffers, tokens compared),
#      and, with the fused qkv and output
#      projections bound to the Triton GEMV (8x512x4) for this run, that step against the same graph on cuBLAS;
#   4. the compiled anchor ($ANCHOR, else .anchor/compiled_anchor.py) at the same 4 layers, batch 1 and 64,
#      if the budget leaves time: its ms per step beside Helios' served ms per step from 3.
# Run from the repository root:  OUT=dir ANCHOR=path bash bench/dkern3_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
budget=${BUDGET:-195}
anchor=${ANCHOR:-.anchor/compiled_anchor.py}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 5)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 5 ? left : 5) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

timeout "$(limit 70)" python3 -m pytest -q -p no:cacheprovider -n 6 -ra --tb=short --maxfail=4 -p no:logging \
  tests/abi/test_rotary_attention.py > "$out/gpu_tests.log" 2>&1
echo "kernel tests: exit $? at ${SECONDS}s: $(tail -1 "$out/gpu_tests.log")"

timeout "$(limit 40)" python3 bench/rotary_attention_ab.py --batches 1,64,256 --contexts 128,256 \
  --json "$out/rotary_attention_ab.json" > "$out/rotary_attention_ab.log" 2>&1
echo "rotary ab: exit $? at ${SECONDS}s"

timeout "$(limit 66)" python3 bench/decode_step_profile.py --layers 4 --batches 1,64 --output 48 --top 60 \
  --gemv-tiles 6144x4096=8x512x4,4096x4096=8x512x4 \
  --json "$out/decode_step_profile.json" > "$out/decode_step_profile.log" 2>&1
echo "step profile: exit $? at ${SECONDS}s"

left=$((budget - SECONDS - 3))
if [ -f "$anchor" ] && [ "$left" -gt 25 ]; then
  timeout "$left" python3 "$anchor" --layers 4 --batches 1,64 --steps 48 --budget $((left - 20)) \
    > "$out/anchor_4layers.log" 2>&1
  echo "anchor: exit $? at ${SECONDS}s"
else
  echo "anchor: skipped ($anchor, ${left}s left)"
fi

echo "== summary"
grep -hE "passed|failed|error|^FAILED|^E " "$out/gpu_tests.log" | tail -12
grep -E "^rotary" "$out/rotary_attention_ab.log"
grep -E "^SUMMARY|^helios" "$out/decode_step_profile.log"
grep -E "_decode_kernel|_rotary_cache_write_kernel" "$out/decode_step_profile.log" | head -6
grep -E '^\{"batch"' "$out/anchor_4layers.log" 2>/dev/null
echo "[done at ${SECONDS}s]"
