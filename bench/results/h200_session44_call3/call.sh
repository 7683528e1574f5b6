#!/usr/bin/env bash
# session 44 call 3: what pinned host allocations cost here, and what they do to another thread's CUDA calls
# (bench/pinned_alloc.py, cudaHostAlloc and cudaHostRegister); then the 8B core's first load (fresh process,
# empty Triton cache) with each weight thread's pinned staging ring at 3 x 32 MB (now), 2 x 8 MB and 3 x 4 MB,
# alternated over three rounds
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 60 python3 bench/pinned_alloc.py > "$out/pinned_alloc.log" 2>&1
timeout 60 python3 bench/pinned_alloc.py --register >> "$out/pinned_alloc.log" 2>&1
echo "== pinned at ${SECONDS}s"; cat "$out/pinned_alloc.log"
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python3 bench/cold_start.py --variants logprobs --skip-no-logprobs-load \
  --keep-core /tmp/core8b > "$out/prepare_and_load.log" 2>&1
echo "== prepared, rc $? at ${SECONDS}s"
for round in 1 2 3; do
  for arm in 32x3 8x2 4x3; do
    TRITON_CACHE_DIR=$(mktemp -d) timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
      --skip-no-logprobs-load --staging-mb ${arm%x*} --staging-slots ${arm#*x} > "$out/staging_${arm}_$round.log" 2>&1
    echo "== $arm round $round rc $? at ${SECONDS}s: $(grep -E '^load \(logprobs\): [0-9]' "$out/staging_${arm}_$round.log") weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' "$out/staging_${arm}_$round.log" | grep -oE '[0-9.]+$') plans $(grep -oE 'capture plans \(graph modules, beside the weights\) +[0-9.]+' "$out/staging_${arm}_$round.log" | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' "$out/staging_${arm}_$round.log" | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' "$out/staging_${arm}_$round.log" | grep -oE '[0-9.]+$')"
  done
done
