#!/usr/bin/env bash
# session 37 call 4: the sampling kernels' GPU tests after the tidy (penalties read through one helper)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_greedy_rows_cuda.py tests/abi/test_triton_sampling.py \
  tests/abi/test_sampling_rows.py tests/abi/test_sampling.py > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"; tail -3 "$out/gpu_tests.log"
