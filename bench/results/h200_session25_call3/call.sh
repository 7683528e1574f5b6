#!/usr/bin/env bash
# session 25 call 3: the 8B cold start (capture plans beside the weights, the indexed merge; empty Triton cache),
# then the anchor comparison as served with the 64- and 256-row step timing
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-workers timeout 170 python3 bench/cold_start.py --layers 32 --variants logprobs \
  --skip-no-logprobs-load --json "$out/logs/cold_start_workers.json" > "$out/logs/cold_start_workers.log" 2>&1
echo "cold start exit $? at ${SECONDS}s"
grep -iE "^load \(|^prepare \(|precompile|waiting|warm-up|capture|Triton kernels|program modules|weights|load_model|plans" "$out/logs/cold_start_workers.log" | grep -v "captured " | head -20
timeout $((590 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --top 30 \
  --anchor-timeout 290 --rotary-fusion on --step-timing 64,256 \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |anchor:|helios |step timing|prepared|loaded|error|Traceback" "$out/logs/anchor_compare.log" | head -40
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
