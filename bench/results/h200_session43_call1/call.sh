#!/usr/bin/env bash
# session 43 call 1: the 8B core's first load (fresh process, empty Triton cache), compile order in the order sent (A)
# against longest first (B, --compile-longest-first), alternated, four rounds; the precompile replay line of each load
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
site=$PWD/tests:/tmp/site
core=$(mktemp -d /tmp/order-core.XXXX)
PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-prepare timeout 150 python3 bench/cold_start.py --layers 32 \
  --variants logprobs --skip-no-logprobs-load --keep-core "$core/kept" > "$out/prepare.log" 2>&1 || { tail -5 "$out/prepare.log"; exit 1; }
echo "== prepared at ${SECONDS}s"
for round in 1 2 3 4; do
  for side in fifo longest; do
    extra=; [ $side = longest ] && extra=--compile-longest-first
    PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-$side-$round timeout 60 python3 bench/cold_start.py \
      --core "$core/kept" --variants logprobs $extra > "$out/empty_${side}_$round.log" 2>&1
    echo "$side round $round: $(grep -m1 -E '^load \(' "$out/empty_${side}_$round.log") at ${SECONDS}s"
    grep -E 'precompile \(|Triton compiles' "$out/empty_${side}_$round.log" | cut -c1-300
  done
done
rm -rf "$core"
