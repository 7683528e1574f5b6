#!/usr/bin/env bash
# session 29 call 3: the GPU tests with dependent launch on (the default): skinny (same bits with and without it), fused, runtime
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 400 python3 -m pytest -q -p no:cacheprovider -rfE --durations=8 \
  tests/gpu/test_skinny_cuda.py tests/gpu/test_fused_cuda.py tests/gpu/test_runtime_cuda.py tests/gpu/test_step_calls_cuda.py \
  tests/gpu/test_greedy_rows_cuda.py > "$out/logs/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/logs/gpu_tests.log" | tail -15 | cut -c1-300
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
