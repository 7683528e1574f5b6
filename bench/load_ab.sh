#!/usr/bin/env bash
# Load time of this tree (B) against another tree's src (A), one device call, logs under $OUT:
# an 8B-shaped core is prepared once (bench/cold_start.py --keep-core), then loaded in fresh processes,
# alternated A/B, first each on an empty Triton cache (a machine's first load), then on a warm one (a
# restart); each load's phase table, whether it imported torch._dynamo, and the totals at the end.
#   OLD_SRC=.anchor/old_src OUT=dir bash bench/load_ab.sh [ROUNDS]
# (OLD_SRC: a copy of an earlier tree's src/, e.g. `git archive REV src | tar -x -C .anchor/old`, carried
# with the call; .whl carried as for bench/anchor_session.sh). A_ARGS / B_ARGS: more bench/cold_start.py
# arguments for one side's loads, e.g. OLD_SRC=src A_ARGS='--compile-order sent' for an A/B of a load option.
# WARM_ROUNDS: rounds on the warm caches (default ROUNDS; 0 for empty-cache loads only).
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
rounds=${1:-2}
old=$(cd "${OLD_SRC:?OLD_SRC: the other tree\'s src directory}" && pwd) || exit 1
shape=(--layers "${LAYERS:-32}"); [ -n "${SMOKE:-}" ] && shape=(--smoke)  # SMOKE=1: tiny shapes, a CPU check
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
site=$PWD/tests; [ -d /tmp/site ] && site=$site:/tmp/site
export PYTHONUNBUFFERED=1
core=$(mktemp -d /tmp/load-ab-core.XXXX)
PYTHONPATH=$PWD/src:$site TRITON_CACHE_DIR=$core/triton-prepare timeout 200 python3 bench/cold_start.py "${shape[@]}" \
  --variants logprobs --skip-no-logprobs-load --keep-core "$core/kept" > "$out/logs/prepare.log" 2>&1 || { tail -20 "$out/logs/prepare.log"; exit 1; }
echo "== prepared at ${SECONDS}s"
load() {  # side (a|b), cache directory, log name
  local path=$PWD/src; [ "$1" = a ] && path=$old
  local extra=${A_ARGS:-}; [ "$1" = b ] && extra=${B_ARGS:-}
  PYTHONPATH=$path:$site TRITON_CACHE_DIR=$2 timeout 90 python3 bench/cold_start.py --core "$core/kept" \
    --variants logprobs ${SMOKE:+--smoke} $extra > "$out/logs/$3.log" 2>&1
  echo "$3: $(grep -m1 -E '^load \(' "$out/logs/$3.log") ($(grep -m1 -o 'torch._dynamo [a-z ]*' "$out/logs/$3.log"))"
}
for round in $(seq 1 "$rounds"); do
  for side in a b; do load $side "$core/triton-$side-$round" "empty_${side}$round"; done
done
for round in $(seq 1 "${WARM_ROUNDS:-$rounds}"); do  # the caches the first round filled
  for side in a b; do load $side "$core/triton-$side-1" "warm_${side}$round"; done
done
rm -rf "$core"
tar -czf "$out/load_ab_logs.tgz" -C "$out" logs && rm -rf "$out/logs"
