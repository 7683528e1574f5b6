#!/usr/bin/env bash
# session 44 call 5: the registered staging rings against pinned ones again (call 4 was even), five more rounds, and the
# GPU test fixed (torch's is_pinned does not see registered memory); the loads as in call 4
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_weight_staging_cuda.py tests/gpu/test_example_core_cuda.py > "$out/gpu_tests.log" 2>&1
echo "== gpu tests rc $? at ${SECONDS}s"; tail -3 "$out/gpu_tests.log"
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python3 bench/cold_start.py --variants logprobs --skip-no-logprobs-load \
  --keep-core /tmp/core8b > "$out/prepare_and_load.log" 2>&1
echo "== prepared, rc $? at ${SECONDS}s"
for round in 1 2 3 4 5; do
  for arm in old new; do
    if [ $arm = old ]; then src=$PWD/.anchor/old/src; else src=$PWD/src; fi
    PYTHONPATH=$src:$PWD/tests:/tmp/site TRITON_CACHE_DIR=$(mktemp -d) timeout 100 python3 bench/cold_start.py --core /tmp/core8b \
      --variants logprobs --skip-no-logprobs-load > "$out/load_${arm}_$round.log" 2>&1
    f="$out/load_${arm}_$round.log"
    echo "== $arm round $round rc $? at ${SECONDS}s: $(grep -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') plans $(grep -oE 'capture plans \(graph modules, beside the weights\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$')"
  done
done
