#!/usr/bin/env bash
# session 54 call 6: the sort-free draw kernel v5 (rows partitioned by first bucket in parallel): tokens, then knob sweep vs the sorted path
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 .anchor/draw_bench.py 2>&1 | grep -v Warn | grep "tokens:" | tee "$out/draw_tokens.log"
timeout 400 python3 .anchor/draw_sweep.py 2>&1 | grep -v Warn | tee "$out/draw_sweep.log" | tail -40
echo "== done at ${SECONDS}s"
timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -x tests/abi/test_sampling.py tests/abi/test_triton_sampling.py \
  tests/runtime/test_sampling_rows_reference.py 2>&1 | tail -15 | tee "$out/tests.log"
echo "== tests done at ${SECONDS}s"
