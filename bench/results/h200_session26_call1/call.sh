#!/usr/bin/env bash
# session 26 call 1: where the 8B cold start's first load goes on the device: cProfile of each stage
# (empty Triton cache), the host's CPUs, then the same load without the profiler
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
(lscpu; nproc; cat /proc/loadavg; free -g) > "$out/logs/host.txt" 2>&1
grep -E "Model name|^CPU\(s\)|MHz|Thread|Socket" "$out/logs/host.txt"
TRITON_CACHE_DIR=/tmp/triton-prof timeout 260 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --profile --profile-rows 40 --keep-core /tmp/core8b --json "$out/logs/cold_start_profile.json" \
  > "$out/logs/cold_start_profile.log" 2>&1
echo "cold start (profiled) exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|program code|weights|load_model|plans" "$out/logs/cold_start_profile.log" | grep -v "captured " | head -30
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
