#!/usr/bin/env bash
# session 24 call 4: the 8B cold start with the compile workers spawned once the programs are built (empty Triton cache)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-workers timeout 220 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --json "$out/logs/cold_start_workers.json" > "$out/logs/cold_start_workers.log" 2>&1
echo "cold start (workers) exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton|program modules|weights|load_model" "$out/logs/cold_start_workers.log" | head -24
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
