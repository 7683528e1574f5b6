#!/usr/bin/env bash
# session 55 call 1: the draw kernel's tokens after the NaN top_p and stored-sum fixes, the speculative ops' selection
# (tokens, then against the sorted references), then every gpu-marked test
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 70 python3 -m pytest -q -p no:cacheprovider -x tests/abi/test_triton_speculative.py \
  tests/abi/test_triton_draws.py 2>&1 | tail -5 | tee "$out/triton_tests.log"
timeout 80 python3 .anchor/spec_bench.py 2>&1 | grep -v Warn | tee "$out/spec_bench.log" | grep -E "checks:|R=  1|R=256|Traceback|Error" | head -20
echo "== spec done at ${SECONDS}s"
BUDGET=$((578 - SECONDS)) bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
