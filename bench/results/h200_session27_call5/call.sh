#!/usr/bin/env bash
# session 27 call 5: the anchor comparison as served with the 64- and 256-row step timing (its prepare / load
# row: the 8B core prepared, then loaded in the same process, empty Triton cache)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 445 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 290 --rotary-fusion on --step-timing 64,256 \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|error|Traceback" "$out/logs/anchor_compare.log" | head -40
