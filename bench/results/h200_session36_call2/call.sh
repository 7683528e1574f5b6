#!/usr/bin/env bash
# session 36 call 2: the same 8B core loaded with a warm Triton cache (a restart on a machine that loaded it before),
# this tree (B) against the tree before it (A), alternated
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
new=$PWD/src:$PWD/tests:/tmp/site; old=$PWD/.anchor/old_src:$PWD/tests:/tmp/site
show() { grep -iE "^load \(|dynamo|program modules|weights|plans|dry run|capture|waiting" "$1" | grep -v "captured " | head -14; }
PYTHONPATH=$new TRITON_CACHE_DIR=/tmp/triton-w timeout 170 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --keep-core /tmp/core8b > "$out/logs/cold_start_prepare.log" 2>&1
echo "== prepare+load rc $? at ${SECONDS}s"; grep -E "prepared|^load \(|dynamo" "$out/logs/cold_start_prepare.log" | head
for run in a1 b1 a2 b2 a3 b3; do
  case $run in a*) path=$old;; *) path=$new;; esac
  PYTHONPATH=$path TRITON_CACHE_DIR=/tmp/triton-w timeout 60 python3 bench/cold_start.py --core /tmp/core8b \
    --variants logprobs --json "$out/logs/warm_$run.json" > "$out/logs/warm_$run.log" 2>&1
  echo "== $run rc $? at ${SECONDS}s"; show "$out/logs/warm_$run.log"
done
rm -rf /tmp/core8b
tar -czf "$out/warm_logs.tgz" -C "$out" logs && rm -rf "$out/logs"
