#!/usr/bin/env bash
# session 24 call 2: cold start with the rotary fusion on (each Triton kernel's compiles listed), then the GPU
# tests with the fusion captured by default
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout 190 python3 bench/cold_start.py --layers 32 --variants logprobs --json "$out/logs/cold_start.json" \
  > "$out/logs/cold_start.log" 2>&1
echo "cold start exit $? at ${SECONDS}s"; grep -iE "prepare \(|load \(|warm-up|capture|Triton|program modules|weights" "$out/logs/cold_start.log" | head -20
left=$((580 - SECONDS))
if [ $left -gt 40 ]; then
  timeout $left python3 -m pytest -v -p no:cacheprovider -n 8 -ra --tb=short -o faulthandler_timeout=$((left-5)) \
    tests/gpu/test_runtime_cuda.py tests/gpu/test_greedy_rows_cuda.py tests/gpu/test_logprobs_cuda.py \
    tests/gpu/test_host_staging_cuda.py tests/gpu/test_fresh_attention_cuda.py tests/gpu/test_prompt_sharing_cuda.py \
    tests/ignition/test_cuda.py tests/gpu/test_attention_sinks_cuda.py tests/gpu/test_example_core_cuda.py \
    tests/gpu/test_vision_cuda.py tests/gpu/test_hybrid_cuda.py tests/gpu/test_latent_cuda.py tests/gpu/test_moe_cuda.py \
    tests/gpu/test_state_graphs_cuda.py tests/gpu/test_fused_cuda.py tests/gpu/test_program_build_cuda.py \
    > "$out/logs/gpu_tests.log" 2>&1
  echo "tests exit $? at ${SECONDS}s"; grep -cE "PASSED" "$out/logs/gpu_tests.log"; grep -E "FAILED|ERROR|passed|failed" "$out/logs/gpu_tests.log" | grep -v "^\[gw.*PASSED" | tail -25
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
