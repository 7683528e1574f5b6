#!/usr/bin/env bash
# session 24 call 3: the Triton precompile at load. GPU tests first (the precompile's two fresh-process loads,
# captures through the restructured capture), then the 8B cold start with compile workers and, in a fresh
# process with its own empty Triton cache, without them (the A/B)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nproc
TRITON_CACHE_DIR=/tmp/triton-tests timeout 150 python3 -m pytest -p no:cacheprovider -n 4 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_fresh_attention_cuda.py tests/gpu/test_logprobs_cuda.py \
  "tests/gpu/test_runtime_cuda.py::test_bfloat16_core_on_cuda_stays_close_to_the_float32_cpu_path" \
  > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -30
TRITON_CACHE_DIR=/tmp/triton-workers timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --json "$out/logs/cold_start_workers.json" > "$out/logs/cold_start_workers.log" 2>&1
echo "cold start (workers) exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton|program modules|weights" "$out/logs/cold_start_workers.log" | head -24
left=$((585 - SECONDS))
if [ $left -gt 120 ]; then
  TRITON_CACHE_DIR=/tmp/triton-serial timeout $left python3 bench/cold_start.py --layers 32 --variants logprobs \
    --compile-workers 0 --skip-no-logprobs-load --json "$out/logs/cold_start_serial.json" \
    > "$out/logs/cold_start_serial.log" 2>&1
  echo "cold start (no workers) exit $? at ${SECONDS}s"
  grep -iE "^load \(|warm-up|capture|Triton" "$out/logs/cold_start_serial.log" | head -10
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
