#!/usr/bin/env bash
# session 25 call 1: the anchor comparison as served, then the 64- and 256-row workloads again with each
# replay's device ms and the idle before it (step timing), and a profiled run of each (trace summary)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout $((585 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --top 30 \
  --anchor-timeout 290 --rotary-fusion on --step-timing 64,256 --trace-dir "$out/logs/traces" \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |anchor:|helios |step timing|timeline|prepared|loaded|error|Traceback" "$out/logs/anchor_compare.log" | head -70
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
