#!/usr/bin/env bash
# session 28 call 1: the skinny matrix product swept against cuBLAS at 64 and 256 rows, then the anchor
# comparison served with the tiles the sweep adopts, and the whole decode step A/B (skinny vs cuBLAS)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-sweep timeout 200 python3 bench/skinny_ab.py --rows 64,256 --json "$out/logs/skinny.json" \
  > "$out/logs/skinny_ab.log" 2>&1
echo "== sweep done at ${SECONDS}s"; grep -v "^SKINNY R=.* tile " "$out/logs/skinny_ab.log" | cut -c1-400
[ -s "$out/logs/skinny.json" ] || echo '[]' > "$out/logs/skinny.json"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout 370 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 64,256 --profile-rows 64 \
  --levers skinny_program_ab,profile --skinny-table "$out/logs/skinny.json" --tests "tests/abi/test_triton_skinny.py" \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|skinny|tests:|error|Traceback" "$out/logs/anchor_compare.log" | head -40 | cut -c1-400
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
