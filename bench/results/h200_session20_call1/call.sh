#!/usr/bin/env bash
# session 20 call 1: the anchor comparison alone on main, then HTTP against in-process (process mode)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 380 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 \
  --anchor-timeout 260 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"; grep -iE "ratio|x anchor|tok/s|TTFT|roofline|prepared|loaded|error|Traceback" "$out/logs/anchor_compare.log" | head -60
left=$((575 - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left python3 bench/http_serving.py --layers 32 --streams 1 64 256 --rounds 2 --server-modes process --json "$out/http_serving.json" 2>&1 | grep -v "Warning\|return cls" > "$out/logs/http_serving.log"
  tail -25 "$out/logs/http_serving.log"
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
