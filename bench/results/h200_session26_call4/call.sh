#!/usr/bin/env bash
# session 26 call 4: the 8B first load (empty Triton cache each time) with the dry run running every full
# graph before the greedy and fresh ones; then a kept core loaded again in fresh processes: 12 workers, and
# the capture order (each plan's graphs in turn) with the default 8
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
show() { grep -iE "^load \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|weights|load_model|plans|  helios\.abi.*sent" "$1" | grep -v "captured " | head -20; }
TRITON_CACHE_DIR=/tmp/triton-a timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --keep-core /tmp/core8b --json "$out/logs/cold_start_a.json" > "$out/logs/cold_start_a.log" 2>&1
echo "== A (prepare + load, full graphs first) exit $? at ${SECONDS}s"; show "$out/logs/cold_start_a.log"
TRITON_CACHE_DIR=/tmp/triton-b timeout 120 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --compile-workers 12 --json "$out/logs/cold_start_b.json" > "$out/logs/cold_start_b.log" 2>&1
echo "== B (load, full graphs first, 12 workers) exit $? at ${SECONDS}s"; show "$out/logs/cold_start_b.log"
TRITON_CACHE_DIR=/tmp/triton-c timeout 120 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs \
  --dry-run-order capture --json "$out/logs/cold_start_c.json" > "$out/logs/cold_start_c.log" 2>&1
echo "== C (load, capture order) exit $? at ${SECONDS}s"; show "$out/logs/cold_start_c.log"
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
