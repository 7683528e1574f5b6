#!/usr/bin/env bash
# session 45 call 1: does the loading thread's dry run wait on the weight threads?
# A 32-layer 8B-width core's first load (fresh process, empty Triton cache) with the weights decoded on all CPUs
# but two (14 threads, the tree) against 8 and 4 threads, alternated; each line prints as its load ends
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
core=/tmp/core32-$$
TRITON_CACHE_DIR=$(mktemp -d) timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs --skip-no-logprobs-load \
  --keep-core $core > "$out/prepare.log" 2>&1
echo "== prepared rc $? at ${SECONDS}s"
for round in 1 2 3 4; do
  for threads in 14 8 4; do
    f="$out/load_${threads}_$round.log"
    TRITON_CACHE_DIR=$(mktemp -d) timeout 60 python3 bench/cold_start.py --core $core --variants logprobs \
      --skip-no-logprobs-load --weight-threads $threads > $f 2>&1
    echo "== $threads threads round $round at ${SECONDS}s: $(grep -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') plans $(grep -oE 'capture plans \(graph modules, beside the weights\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$')"
  done
done
