#!/usr/bin/env bash
# Cold TTFT levers (issue 18) in one device call on one H200, about 3 minutes, logs under $OUT:
#   the runtime's CUDA tests and silu_mul's (-n 6) beside the 8B-shaped core's checkpoint writing, preparation and
#   load (bench/ttft_levers.py waits for them before it measures: the cold prompt's pages, cold TTFT
#   with the run allocator against the shuffled FIFO free list, the timeline of one cold request),
#   then the swapped gate/up product + column-major silu_mul, the long attention tiles and the
#   prefill's GEMMs against their alternatives (bench/prefill_kernels_ab.py). Run from the repository root:  OUT=dir bash bench/ttft_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
started=$SECONDS
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
( timeout 110 python3 -m pytest -q -p no:cacheprovider -n 6 -ra -o faulthandler_timeout=100 \
    tests/gpu/test_runtime_cuda.py tests/gpu/test_prompt_sharing_cuda.py \
    tests/gpu/test_fused_cuda.py::test_silu_mul_in_a_graph \
    tests/gpu/test_fused_cuda.py::test_silu_mul_of_a_column_major_product_in_a_graph > "$out/gpu_tests.log" 2>&1
  echo "exit $?" >> "$out/gpu_tests.log"; touch "$out/tests.done" ) &
tests=$!
timeout 150 python3 bench/ttft_levers.py --layers "${LAYERS:-32}" --wait "$out/tests.done" --wait-s 100 \
  --json "$out/ttft_levers.json" 2>&1 | grep -v "checkpoint: layer\|FutureWarning\|return cls" > "$out/ttft_levers.log"
wait $tests
left=$(( 193 - (SECONDS - started) ))
if [ "$left" -gt 20 ]; then
  timeout "$left" python3 bench/prefill_kernels_ab.py --layers "${LAYERS:-32}" --json "$out/prefill_kernels_ab.json" \
    > "$out/prefill_kernels_ab.log" 2>&1
else
  echo "no time left for bench/prefill_kernels_ab.py" > "$out/prefill_kernels_ab.log"
fi
echo "=== summary ($(( SECONDS - started )) s)"
tail -3 "$out/gpu_tests.log"
grep -E "fresh engine|cold TTFT|saves|timeline|kernels by kind|loaded|prepared|prefill step" "$out/ttft_levers.log"
grep -E "GEMMs x|gate_up \+ silu|served|ht64x64x4x3 |ht128x64x8x3 |prefill attention" "$out/prefill_kernels_ab.log"
