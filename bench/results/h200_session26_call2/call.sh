#!/usr/bin/env bash
# session 26 call 2: the 8B cold start with a launch of a variant already sent skipped before Triton
# packs it (empty Triton cache), the load's own thread sampled every 2 ms; then the precompile's CUDA tests
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-a timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --sample --profile-rows 45 --json "$out/logs/cold_start_sampled.json" \
  > "$out/logs/cold_start_sampled.log" 2>&1
echo "cold start (sampled) exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|weights|load_model|plans" "$out/logs/cold_start_sampled.log" | grep -v "captured " | head -24
TRITON_CACHE_DIR=/tmp/triton-tests timeout $((560 - SECONDS)) python3 -m pytest -p no:cacheprovider -n 4 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/logs/gpu_tests.log" | head -20
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
