#!/usr/bin/env bash
# session 20 call 4: the anchor comparison on the merged main (decode, roofline, TTFT), then the greedy-rows sampling-tail GPU test if time is left
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout ${ANCHOR_LIMIT:-315} python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 \
  --anchor-timeout 230 --profile-rows 1,256 --json "$out/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"; grep -A9 "| decode tok/s" "$out/logs/anchor_compare.log" | head -10
grep -E "^decode step R=|Traceback|Error" "$out/logs/anchor_compare.log" | head -8
left=$((${TOTAL:-345} - SECONDS))
if [ $left -gt 20 ]; then
  timeout $left python3 -m pytest -q -p no:cacheprovider -ra --tb=short -p no:logging tests/gpu/test_greedy_rows_cuda.py -k sampling_tail > "$out/logs/greedy_tail.log" 2>&1
  echo "greedy tail test: exit $?"; tail -n 3 "$out/logs/greedy_tail.log"
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
