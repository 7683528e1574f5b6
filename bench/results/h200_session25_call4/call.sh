#!/usr/bin/env bash
# session 25 call 4: the 8B cold start with programs' own code generated on first use (empty Triton cache),
# then the CUDA tests of the load path (precompile in fresh processes, bf16 runtime against the CPU path)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-workers timeout 150 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --json "$out/logs/cold_start_workers.json" > "$out/logs/cold_start_workers.log" 2>&1
echo "cold start exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|program code|weights|load_model" "$out/logs/cold_start_workers.log" | grep -v "captured " | head -20
TRITON_CACHE_DIR=/tmp/triton-tests timeout $((270 - SECONDS)) python3 -m pytest -p no:cacheprovider -n 8 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py \
  tests/gpu/test_greedy_rows_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -20
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
