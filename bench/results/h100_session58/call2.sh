#!/usr/bin/env bash
# Session 58, call 2: call 1 (next_call.sh of session 57) ran out of time. Every family's CUDA check sits in one
# file, which `--dist loadfile` gives to one worker (about 14 s a family, 64 families): 18 passed in the 300 s.
# The GPU suite after it stopped at 73% with errors that its quiet log does not name. Here the suite runs
# first without that file, verbose, then the family checks spread over the workers test by test.
# Run from the repository root with .whl carried:  OUT=dir bash bench/results/h100_session58/call2.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 330 python3 -m pytest -v -p no:cacheprovider -rfEs -n 8 --dist loadfile \
  --durations=25 -m gpu --deselect tests/gpu/test_families_cuda.py --ignore tests/gpu/test_families_cuda.py \
  tests/gpu tests/abi tests/parallel tests/runtime tests/ignition > "$out/gpu_tests.log" 2>&1
echo "== gpu suite rc $? at ${SECONDS}s"
grep -oE "(PASSED|FAILED|ERROR|SKIPPED) tests/[^ :]*" "$out/gpu_tests.log" | sort | uniq -c | grep -v PASSED | head -30
grep -E "^(FAILED|ERROR) " "$out/gpu_tests.log" | head -30 | cut -c1-300
tail -3 "$out/gpu_tests.log" | cut -c1-300
TRITON_CACHE_DIR=/tmp/triton-tests timeout $((570 - SECONDS)) python3 -m pytest -v -p no:cacheprovider -rfEs -n 12 --dist load \
  --durations=10 tests/gpu/test_families_cuda.py > "$out/families.log" 2>&1
echo "== families rc $? at ${SECONDS}s"
grep -oE "(PASSED|FAILED|ERROR) tests/[^ ]*" "$out/families.log" | awk '{print $1}' | sort | uniq -c
grep -E "^(FAILED|ERROR) " "$out/families.log" | head -20 | cut -c1-300
tail -2 "$out/families.log" | cut -c1-300
