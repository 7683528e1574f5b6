#!/usr/bin/env bash
# session 46 call 3: the CUDA tests of the load path (precompile in fresh processes; bf16 runtime against the CPU
# path; greedy graphs) on the tree with the 0.5 ms load switch interval, with a longer limit than session 45 call 2
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 420 python3 -m pytest -p no:cacheprovider -n 8 -rA --tb=short --durations=8 \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py \
  tests/gpu/test_greedy_rows_cuda.py > "$out/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  |s call" "$out/gpu_tests.log" | head -30
