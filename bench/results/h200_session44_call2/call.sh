#!/usr/bin/env bash
# session 44 call 2: the first CUDA calls' costs in a fresh process (bench/first_calls.py: alone, beside 8 busy
# processes, with the first calls made on another thread first); the 8B core prepared and kept, then loaded in
# fresh processes under torch's profiler: with an empty Triton cache, then with the variants on disk
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
python3 bench/first_calls.py > "$out/first_calls.log" 2>&1
python3 bench/first_calls.py --busy 8 >> "$out/first_calls.log" 2>&1
python3 bench/first_calls.py --other-thread >> "$out/first_calls.log" 2>&1
echo "== first calls at ${SECONDS}s"; cat "$out/first_calls.log"
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python3 bench/cold_start.py --variants logprobs --skip-no-logprobs-load \
  --keep-core /tmp/core8b > "$out/prepare_and_load.log" 2>&1
echo "== rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-profiled timeout 120 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --skip-no-logprobs-load --torch-profile --profile-rows 45 > "$out/profiled_empty.log" 2>&1
echo "== rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-profiled timeout 120 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --skip-no-logprobs-load --torch-profile --profile-rows 45 > "$out/profiled_warm.log" 2>&1
echo "== rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=$(mktemp -d) timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --skip-no-logprobs-load > "$out/plain_empty.log" 2>&1
echo "== rc $? at ${SECONDS}s"
for f in prepare_and_load profiled_empty profiled_warm plain_empty; do echo "=== $f"; grep -E "^load \(|dry run on|waiting for|weights \(|capture plans|warm-up|record" "$out/$f.log" | head -8; done
grep -A46 "this thread" "$out/profiled_empty.log" | cut -c1-150
