#!/usr/bin/env bash
# session 30 call 4: the load-time choice timed over 2 GB of distinct weights; the anchor comparison served with it
# and the whole-step A/B of F.linear against the chosen algorithms
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
timeout 60 python3 .anchor/probe.py 2>&1 | grep -v Warning | tee "$out/logs/probe.log"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((560 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 64,256 --levers lt_program_ab \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|lt decode|chosen \(|loaded in|error|Traceback" "$out/logs/anchor_compare.log" | head -40 | cut -c1-400
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
