#!/usr/bin/env bash
# session 44 call 1: where the load's main thread spends its time (the dry run on stand-ins above all), the 8B core
# (fresh machine, empty Triton cache), its stack sampled every 2 ms; then the same core loaded again (the variants
# now on disk: the dry run compiles nothing) and once more with the empty cache and no sampler
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-sample timeout 200 python3 bench/cold_start.py --variants logprobs \
  --skip-no-logprobs-load --sample --profile-rows 40 --keep-core /tmp/core8b > "$out/sampled_empty.log" 2>&1
echo "== rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-sample timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --skip-no-logprobs-load --sample --profile-rows 40 > "$out/sampled_warm.log" 2>&1
echo "== rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=$(mktemp -d) timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --skip-no-logprobs-load > "$out/plain_empty.log" 2>&1
echo "== rc $? at ${SECONDS}s"
for f in sampled_empty sampled_warm plain_empty; do echo "=== $f"; grep -E "^load \(|dry run|waiting for|weights \(|capture plans|warm-up|record" "$out/$f.log" | head -12; done
