#!/usr/bin/env bash
# session 43 call 3: the precompile GPU test, then the 8B core's first load (fresh process, empty Triton cache): HEAD's tree
# first load (fresh process, empty Triton cache): HEAD's tree (one wait for every variant before capturing; A) against
# this tree (each graph waits for its own variants; B), both compiling longest first, alternated, four rounds
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
site=$PWD/tests:/tmp/site
PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=/tmp/triton-tests timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu \
  tests/gpu/test_kernel_precompile_cuda.py > "$out/gpu_test.log" 2>&1
echo "== precompile GPU test rc $? at ${SECONDS}s"; tail -3 "$out/gpu_test.log" | cut -c1-300
core=$(mktemp -d /tmp/wait-core.XXXX)
PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-prepare timeout 150 python3 bench/cold_start.py --layers 32 \
  --variants logprobs --skip-no-logprobs-load --keep-core "$core/kept" > "$out/prepare.log" 2>&1 || { tail -5 "$out/prepare.log"; exit 1; }
echo "== prepared at ${SECONDS}s"
for round in 1 2 3 4; do
  for side in a b; do
    path=$PWD/src; [ $side = a ] && path=$PWD/.anchor/old/src
    PYTHONPATH=$path:$site TRITON_CACHE_DIR=$core/triton-$side-$round timeout 60 python3 bench/cold_start.py \
      --core "$core/kept" --variants logprobs > "$out/empty_${side}_$round.log" 2>&1
    echo "$side round $round: $(grep -m1 -E '^load \(' "$out/empty_${side}_$round.log") at ${SECONDS}s"
    grep -E '\[in capture\]|precompile \(' "$out/empty_${side}_$round.log" | cut -c1-200
  done
done
rm -rf "$core"
