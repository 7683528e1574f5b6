#!/usr/bin/env bash
# session 45 call 4: where a 32-layer load's dry run goes with each repeated call made once: the loading thread's
# stack sampled, fresh processes, a warm Triton cache (nothing compiles: the dry run alone) with and without the
# repeated calls made (--dry-run-every-call), then an empty cache
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
core=/tmp/core32s-$$ warm=/tmp/triton-w-$$
TRITON_CACHE_DIR=$warm timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs --skip-no-logprobs-load \
  --keep-core $core > "$out/prepare.log" 2>&1
echo "== prepared rc $? at ${SECONDS}s"
run() {  # name, cache, extra args
  f="$out/sample_$1.log"
  TRITON_CACHE_DIR=$2 timeout 70 python3 bench/cold_start.py --core $core --variants logprobs \
    --skip-no-logprobs-load --sample --profile-rows 60 $3 > $f 2>&1
  echo "== $1 rc $? at ${SECONDS}s: $(grep -m1 -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$') $(grep -oE '[0-9]+ repeated calls not made' $f)"
}
run warm $warm ""
run warm_every $warm --dry-run-every-call
run empty /tmp/triton-e-$$ ""
