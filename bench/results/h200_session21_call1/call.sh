#!/usr/bin/env bash
# session 21 call 1: the anchor comparison alone on main (all-rows-live ratio), then GPU tests of the pieces not yet run on a GPU
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 470 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --top 40 \
  --anchor-timeout 330 --json "$out/logs/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"; grep -iE "^\| |anchor:|helios |prepared|loaded|error|Traceback" "$out/logs/anchor_compare.log" | head -40
left=$((585 - SECONDS))
if [ $left -gt 45 ]; then
  timeout $left python3 -m pytest -q -p no:cacheprovider -n 6 -ra -o faulthandler_timeout=$((left-5)) \
    tests/gpu/test_greedy_rows_cuda.py tests/gpu/test_runtime_cuda.py tests/gpu/test_host_staging_cuda.py \
    > "$out/logs/gpu_tests.log" 2>&1
  echo "tests exit $?"; grep -v "Warning\|warn" "$out/logs/gpu_tests.log" | tail -15
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
