#!/usr/bin/env bash
# session 53 call 1: the 8B core's load at fractions 0.85 and 0.9 with row-blocked draws/logprobs and the cache released before each capture; then session 52's capture at 0.85 (A/B, same call)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
filter() { grep -v "checkpoint: layer\|DEBUG\|FutureWarning\|isinstance(treespec"; }
TRITON_CACHE_DIR=/tmp/triton-mem timeout 260 python3 bench/load_memory.py --memory-fraction 0.85,0.9 --top 14 --device-gib 79.18 2>&1 | filter > "$out/load_memory_new.log"
echo "== new done at ${SECONDS}s"
grep -E "GiB|load|out of memory|Error|again" "$out/load_memory_new.log" | tail -45 | cut -c1-250
TRITON_CACHE_DIR=/tmp/triton-mem timeout 200 python3 .anchor/load_memory_old.py --memory-fraction 0.85 --top 14 --device-gib 79.18 2>&1 | filter > "$out/load_memory_old.log"
echo "== old done at ${SECONDS}s"
grep -E "loaded in|load failed|out of memory allocating|again|capture_programs" "$out/load_memory_old.log" | tail -12 | cut -c1-250
timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_ops_cuda.py tests/gpu/test_logprobs_cuda.py -k "sample or row_blocks or logprob" > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"; tail -5 "$out/gpu_tests.log" | cut -c1-300
