#!/usr/bin/env bash
# session 45 call 3: the precompile's CUDA test alone (call 2's test run ran out of time with two tests left), then
# where the dry run's time goes now that each repeated call is made once: an 8-layer 8B-width core, fresh processes,
# the loading thread's stack sampled, the Triton cache empty then warm
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests3 timeout 230 python3 -m pytest -p no:cacheprovider -rA --tb=short --durations=5 \
  tests/gpu/test_kernel_precompile_cuda.py > "$out/precompile_test.log" 2>&1
echo "test exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/precompile_test.log" | head -20
core=/tmp/core8s-$$
timeout 100 python3 bench/cold_start.py --layers 8 --variants logprobs --skip-no-logprobs-load --keep-core $core \
  > "$out/prepare.log" 2>&1
echo "== prepared rc $? at ${SECONDS}s"
for cache in empty warm; do
  TRITON_CACHE_DIR=/tmp/triton-s-$$ timeout 60 python3 bench/cold_start.py --core $core --variants logprobs \
    --skip-no-logprobs-load --sample --profile-rows 45 > "$out/sample_$cache.log" 2>&1
  f="$out/sample_$cache.log"
  echo "== $cache rc $? at ${SECONDS}s: $(grep -m1 -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') $(grep -oE '[0-9]+ repeated calls not made' $f)"
done
