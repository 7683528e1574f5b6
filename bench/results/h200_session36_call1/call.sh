#!/usr/bin/env bash
# session 36 call 1: the load without torch._dynamo: an 8B core prepared once, then loaded (cold Triton cache each
# time) by this tree (B) and by the tree before it (A, .anchor/old_src), alternated; then every gpu-marked test
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
new=$PWD/src:$PWD/tests:/tmp/site; old=$PWD/.anchor/old_src:$PWD/tests:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
show() { grep -iE "^load \(|dynamo|program modules|weights|plans|dry run|capture|waiting|deserialize" "$1" | grep -v "captured " | head -16; }
PYTHONPATH=$new TRITON_CACHE_DIR=/tmp/triton-0 timeout 170 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --keep-core /tmp/core8b --json "$out/logs/cold_start_prepare.json" > "$out/logs/cold_start_prepare.log" 2>&1
echo "== prepare+load rc $? at ${SECONDS}s"; grep -E "prepared|^load \(|dynamo" "$out/logs/cold_start_prepare.log" | head
for run in b1 a1 b2 a2; do
  case $run in a*) path=$old;; *) path=$new;; esac
  PYTHONPATH=$path TRITON_CACHE_DIR=/tmp/triton-$run timeout 60 python3 bench/cold_start.py --core /tmp/core8b \
    --variants logprobs --json "$out/logs/cold_start_$run.json" > "$out/logs/cold_start_$run.log" 2>&1
  echo "== $run rc $? at ${SECONDS}s"; show "$out/logs/cold_start_$run.log"
done
rm -rf /tmp/core8b
tar -czf "$out/cold_start_logs.tgz" -C "$out" logs && rm -rf "$out/logs"
BUDGET=$((592 - SECONDS)) OUT=$out bash bench/gpu_suite.sh 6
echo "== suite done at ${SECONDS}s"
