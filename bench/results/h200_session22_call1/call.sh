#!/usr/bin/env bash
# session 22 call 1: the anchor comparison on main first, then GPU tests (prompt programs with the last layer on sampled rows, the lean cohort host path, held freed memory)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 400 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --top 40 \
  --anchor-timeout 290 --json "$out/logs/anchor_compare.json" 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"; grep -iE "^\| |anchor:|helios |prepared|loaded|error|Traceback|decode step R=" "$out/logs/anchor_compare.log" | head -40
left=$((495 - SECONDS))
if [ $left -gt 40 ]; then
  timeout $left python3 -m pytest -q -p no:cacheprovider -n 6 -ra --tb=short -o faulthandler_timeout=$((left-5)) \
    tests/gpu/test_runtime_cuda.py tests/gpu/test_step_calls_cuda.py tests/gpu/test_fresh_attention_cuda.py \
    tests/gpu/test_greedy_rows_cuda.py tests/gpu/test_vision_cuda.py tests/gpu/test_hybrid_cuda.py \
    tests/gpu/test_latent_cuda.py tests/gpu/test_moe_cuda.py tests/gpu/test_logprobs_cuda.py \
    tests/gpu/test_host_staging_cuda.py tests/abi/test_rotary_attention.py > "$out/logs/gpu_tests.log" 2>&1
  echo "tests exit $?"; grep -E "^FAILED|^ERROR|passed|failed|^E  " "$out/logs/gpu_tests.log" | tail -25
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
