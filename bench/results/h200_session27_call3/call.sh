#!/usr/bin/env bash
# the 8B first load: workers forked from a fork server that imports torch and Triton once, torch._dynamo
# imported on a thread of the load; B (fresh process) twice; the precompile and runtime CUDA tests
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
show() { grep -iE "^load \(|Triton kernels|program modules|weights|load_model|plans|stand-ins|dry run|capture|waiting" "$1" | grep -v "captured " | head -16; }
TRITON_CACHE_DIR=/tmp/triton-a timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --keep-core /tmp/core8b --json "$out/logs/cold_start_a.json" > "$out/logs/cold_start_a.log" 2>&1
echo "== A exit $? at ${SECONDS}s"; show "$out/logs/cold_start_a.log"
for run in b1:5 b2:5; do
  name=${run%%:*}; interval=${run##*:}
  TRITON_CACHE_DIR=/tmp/triton-$name timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs --sample \
    --switch-interval $interval --json "$out/logs/cold_start_$name.json" > "$out/logs/cold_start_$name.log" 2>&1
  echo "== $name (switch interval $interval ms) exit $? at ${SECONDS}s"; show "$out/logs/cold_start_$name.log"
done
TRITON_CACHE_DIR=/tmp/triton-tests timeout 170 python3 -m pytest -p no:cacheprovider -n 4 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -20
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
