#!/usr/bin/env bash
# Cold TTFT levers (issue 18) in one device call on one H200, at most about 190 s. Logs under $OUT
# (two files: ttft_session.log, ttft_levers.json), the measurements also on the console at the end:
#   GPU tests (-n 6): the runtime on CUDA, prompt sharing, silu_mul (row-major and column-major) and the
#   prefill kernel at Llama-8B shapes with the served tiles (descriptor tiles on consecutive pages),
#   beside the 8B-shaped core's checkpoint writing, preparation and load; then bench/ttft_levers.py
#   (it waits for the tests before it measures): the cold prompt's pages, cold TTFT with the run
#   allocator against the shuffled FIFO free list, the timeline of one cold request (host before the
#   graph launch, the launch against its first kernel, kernels by kind, host ops and functions), and
#   the whole prefill step replayed as served, with the previous long tile and with cuBLASLt.
# Run from the repository root:  OUT=dir bash bench/ttft_session.sh   (LAYERS=4 for a quick run)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
started=$SECONDS
scratch=$(mktemp -d)
log="$out/ttft_session.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$log"
( timeout 110 python3 -m pytest -q -p no:cacheprovider -n 6 -ra -o faulthandler_timeout=100 \
    tests/gpu/test_runtime_cuda.py tests/gpu/test_prompt_sharing_cuda.py \
    tests/gpu/test_fused_cuda.py::test_silu_mul_in_a_graph \
    tests/gpu/test_fused_cuda.py::test_silu_mul_of_a_column_major_product_in_a_graph \
    tests/abi/test_triton_prefill.py::test_tile_choice \
    tests/abi/test_triton_prefill.py::test_llama_shapes_on_the_device \
    tests/abi/test_triton_prefill.py::test_llama_shapes_on_consecutive_pages > "$scratch/tests.log" 2>&1
  echo "exit $?" >> "$scratch/tests.log"; touch "$scratch/tests.done" ) &
tests=$!
timeout 185 python3 bench/ttft_levers.py --layers "${LAYERS:-32}" --wait "$scratch/tests.done" --wait-s 110 \
  --repeats 7 --json "$out/ttft_levers.json" 2>&1 | grep -v "checkpoint: layer\|FutureWarning\|return cls" \
  > "$scratch/levers.log"
wait $tests
{ echo "=== GPU tests"; grep -v "PytestBenchmarkWarning\|warner(" "$scratch/tests.log" | tail -25
  echo "=== bench/ttft_levers.py"; cat "$scratch/levers.log"; } >> "$log"
rm -rf "$scratch"
echo "=== summary ($(( SECONDS - started )) s)"
grep -E "passed|failed|error|^exit" "$log" | tail -3
sed -n '/=== bench\/ttft_levers.py/,$p' "$log" | grep -v "^=== "
