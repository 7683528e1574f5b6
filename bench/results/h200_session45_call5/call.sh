#!/usr/bin/env bash
# session 45 call 5: the thread switch interval (the stack sampler sets 0.5 ms; Python's default is 5 ms) over a
# 32-layer load, fresh processes, no sampler, alternated: warm Triton cache, then empty
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
core=$(ls -d /tmp/core32s-* 2>/dev/null | head -1); warm=$(ls -d /tmp/triton-w-* 2>/dev/null | head -1)
if [ -z "$core" ]; then
  core=/tmp/core32s-$$ warm=/tmp/triton-w-$$
  TRITON_CACHE_DIR=$warm timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs --skip-no-logprobs-load \
    --keep-core $core > "$out/prepare.log" 2>&1
  echo "== prepared rc $? at ${SECONDS}s"
fi
run() {  # name, cache, extra args
  f="$out/load_$1.log"
  TRITON_CACHE_DIR=$2 timeout 60 python3 bench/cold_start.py --core $core --variants logprobs \
    --skip-no-logprobs-load $3 > $f 2>&1
  echo "== $1 rc $? at ${SECONDS}s: $(grep -m1 -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') plans $(grep -oE 'capture plans \(graph modules, beside the weights\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$')"
}
for round in 1 2; do
  run warm_5ms_$round $warm ""
  run warm_0.5ms_$round $warm "--switch-interval 0.5"
done
run empty_5ms /tmp/triton-e5-$$ ""
run empty_0.5ms /tmp/triton-e05-$$ "--switch-interval 0.5"
