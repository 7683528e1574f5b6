#!/usr/bin/env bash
# session 42 call 7: the 8B core's first load (fresh process, empty Triton cache) with 14 compile workers against the
# default 8, alternated (bench/cold_start.py --compile-workers), as far as the device time left allows
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
site=$PWD/tests:/tmp/site
core=$(mktemp -d /tmp/workers-core.XXXX)
PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-prepare timeout 150 python3 bench/cold_start.py --layers 32 \
  --variants logprobs --skip-no-logprobs-load --keep-core "$core/kept" > "$out/prepare.log" 2>&1 || { tail -5 "$out/prepare.log"; exit 1; }
echo "== prepared at ${SECONDS}s"
for round in 1 2; do
  for workers in 14 8; do
    PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-$workers-$round timeout 60 python3 bench/cold_start.py \
      --core "$core/kept" --variants logprobs --compile-workers $workers > "$out/empty_w${workers}_$round.log" 2>&1
    echo "workers $workers round $round: $(grep -m1 -E '^load \(' "$out/empty_w${workers}_$round.log"); $(grep -m1 -o 'Triton kernels: .*' "$out/empty_w${workers}_$round.log" | cut -c1-160) at ${SECONDS}s"
  done
done
