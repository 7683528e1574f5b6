#!/usr/bin/env bash
# session 25 call 2: the 8B cold start with the capture plans built beside the weights (empty Triton cache,
# default workers), then GPU capture tests, then (time permitting) the cold start with 15 workers
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-workers timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --json "$out/logs/cold_start_workers.json" > "$out/logs/cold_start_workers.log" 2>&1
echo "cold start (default workers) exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton|program modules|weights|load_model|plans" "$out/logs/cold_start_workers.log" | grep -v "captured " | head -24
TRITON_CACHE_DIR=/tmp/triton-tests timeout 220 python3 -m pytest -p no:cacheprovider -n 8 -ra --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_fresh_attention_cuda.py tests/gpu/test_logprobs_cuda.py \
  tests/gpu/test_runtime_cuda.py tests/gpu/test_step_calls_cuda.py tests/gpu/test_greedy_rows_cuda.py \
  tests/gpu/test_state_graphs_cuda.py tests/gpu/test_initialization_cuda.py tests/gpu/test_hybrid_cuda.py \
  tests/gpu/test_latent_cuda.py tests/gpu/test_moe_cuda.py tests/gpu/test_host_staging_cuda.py \
  > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -30
left=$((585 - SECONDS))
if [ $left -gt 130 ]; then
  TRITON_CACHE_DIR=/tmp/triton-15 timeout $left python3 bench/cold_start.py --layers 32 --variants logprobs \
    --compile-workers 15 --skip-no-logprobs-load --json "$out/logs/cold_start_15.json" > "$out/logs/cold_start_15.log" 2>&1
  echo "cold start (15 workers) exit $? at ${SECONDS}s"
  grep -iE "^load \(|precompile|waiting|warm-up|capture|Triton kernels|plans" "$out/logs/cold_start_15.log" | grep -v "captured " | head -12
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
