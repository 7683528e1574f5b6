#!/usr/bin/env bash
# Issue 18, the launches of the batch-1 greedy decode step, in one device call on one H200 (at most
# BUDGET seconds, default 185), logs under $OUT:
#   1. bench/step_launches_ab.py: one 32-layer 8B-shaped core, its batch-1 greedy DECODE graph captured as
#      main captures it, with the bookkeeping collapsed (step_calls), with the rotary pairs fused, with both,
#      and with both plus the elementwise runs fused, in one process from the same buffers: device ms per
#      replay, kernels per step by kind, tokens and logits against main's graph; and the both-rewrites step
#      captured with cuBLASLt, with fp32 split-K reductions, and with the one-row projections on transposed
#      weight copies (what cuBLAS picks without the split-K launches); the 64-row step (main, steps, both,
#      both+runs; timed, not profiled) from the same served state (a regression check).
#   2. GPU tests (pytest -n 6): the integer accumulation and cache-slot kernels
#      (tests/abi/test_triton_accumulate.py, tests/abi/test_triton_slots.py), the generated elementwise-run
#      kernels (tests/abi/test_elementwise_runs.py),
#      helios::rotary_paged_attention against the two-kernel sequence (tests/abi/test_rotary_attention.py:
#      small shapes compiled, and 8B shapes replayed from CUDA graphs), the capture-time bookkeeping rewrite
#      on exported programs (tests/runtime/test_step_calls.py) and served through captured graphs against
#      the graphs without it (tests/gpu/test_step_calls_cuda.py), and the greedy graphs
#      (tests/gpu/test_greedy_rows_cuda.py);
# Run from the repository root:  OUT=dir bash bench/decb1_session.sh      (SMOKE=1: tiny shapes on the CPU;
# PART=bench or PART=tests: one part with the whole budget - together they need more than 185 s: the
# 2026-12-02 call spent 46 s preparing the 32-layer core, 17 s serving 64 requests eagerly)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
budget=${BUDGET:-185}
python=${PYTHON:-python3}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 5)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 5 ? left : 5) ))
}
kernel_tests="tests/abi/test_triton_accumulate.py tests/abi/test_triton_slots.py tests/abi/test_elementwise_runs.py
  tests/abi/test_rotary_attention.py"
runtime_tests="tests/gpu/test_step_calls_cuda.py tests/gpu/test_greedy_rows_cuda.py tests/runtime/test_step_calls.py"
if [ "${SMOKE:-0}" = 1 ]; then
  workers="" bench_args="--smoke --batches 1,2"
else
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  workers="-n 6" bench_args="--layers 32 --rounds 3 --batches 1,64"
fi

part_wanted() { [ "${PART:-all}" = all ] || [ "${PART:-all}" = "$1" ]; }

if part_wanted bench; then
  # shellcheck disable=SC2086
  timeout "$(limit 120)" $python bench/step_launches_ab.py $bench_args --json "$out/step_launches_ab.json" \
    > "$out/step_launches_ab.log" 2>&1
  echo "step A/B: exit $? at ${SECONDS}s"
fi

# each file's test names as they finish (-v), so that a run cut off by its timeout still names its failures
for part in kernel runtime; do
  part_wanted tests || continue
  files=${part}_tests
  # shellcheck disable=SC2086
  timeout "$(limit $([ $part = kernel ] && echo 60 || echo 75))" $python -m pytest -v -p no:cacheprovider $workers -ra \
    --tb=short -p no:logging ${!files} > "$out/${part}_tests.log" 2>&1
  echo "$part tests: exit $? at ${SECONDS}s: $(tail -1 "$out/${part}_tests.log")"
done

echo "== summary"
for part in kernel runtime; do
  echo "-- $part tests"
  grep -hE " passed| failed|error|FAILED|^E " "$out/${part}_tests.log" 2>/dev/null | tail -14
done
grep -E "^\||^SUMMARY|^round|graph calls|loaded|served|core \(|Error|error" "$out/step_launches_ab.log" 2>/dev/null | tail -40
