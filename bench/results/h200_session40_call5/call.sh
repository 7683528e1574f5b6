#!/usr/bin/env bash
# session 40 call 5: the vision GPU tests, which call 4 could not import (openai 3 needs httpx2, now carried)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/httpx2*.whl .whl/httpcore2*.whl
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 280 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/gpu/test_vision_cuda.py \
  > "$out/gpu_tests.log" 2>&1
echo "== vision tests rc $? at ${SECONDS}s"; tail -5 "$out/gpu_tests.log" | cut -c1-300
