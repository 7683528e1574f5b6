#!/usr/bin/env bash
# session 44 call 6: where the loading thread's Python goes per op call (cProfile over the load: the op bodies,
# their argument checks, Triton's launch path, the dry run's launch keys), an 8-layer 8B-width core, fresh processes:
# the Triton cache empty, then warm
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
core=/tmp/core8l-$$
timeout 100 python3 bench/cold_start.py --layers 8 --variants logprobs --skip-no-logprobs-load --keep-core $core \
  > "$out/prepare.log" 2>&1
echo "== prepared rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-op-$$ timeout 100 python3 bench/cold_start.py --core $core --variants logprobs \
  --skip-no-logprobs-load --profile --profile-rows 70 > "$out/profile_empty.log" 2>&1
echo "== empty rc $? at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-op-$$ timeout 100 python3 bench/cold_start.py --core $core --variants logprobs \
  --skip-no-logprobs-load --profile --profile-rows 70 > "$out/profile_warm.log" 2>&1
echo "== warm rc $? at ${SECONDS}s"
grep -E "^load \(" "$out"/profile_*.log
