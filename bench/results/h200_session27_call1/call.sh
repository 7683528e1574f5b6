#!/usr/bin/env bash
# next session's first call: the 8B first load with the collector paused, shared metas, triton_key ahead
# (empty Triton cache; A: after prepare, B: fresh process), the precompile CUDA test
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
show() { grep -iE "^load \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|weights|load_model|plans|stand-ins|dry run" "$1" | grep -v "captured " | head -20; }
TRITON_CACHE_DIR=/tmp/triton-a timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --keep-core /tmp/core8b --json "$out/logs/cold_start_a.json" > "$out/logs/cold_start_a.log" 2>&1
echo "== A exit $? at ${SECONDS}s"; show "$out/logs/cold_start_a.log"
TRITON_CACHE_DIR=/tmp/triton-b timeout 120 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs --sample \
  --json "$out/logs/cold_start_b.json" > "$out/logs/cold_start_b.log" 2>&1
echo "== B exit $? at ${SECONDS}s"; show "$out/logs/cold_start_b.log"
TRITON_CACHE_DIR=/tmp/triton-tests timeout 150 python3 -m pytest -p no:cacheprovider -n 4 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -20
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
