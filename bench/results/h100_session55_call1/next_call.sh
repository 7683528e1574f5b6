#!/usr/bin/env bash
# session 55 call 2: after the p_max race fix - the selection's tests on CUDA, the gpu tests that failed in call 1 plus
# Gemma 3's, then the speculative ops' tokens and times against the sorted references and the sampled op's tokens
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs -n 7 --dist loadfile \
  tests/abi/test_triton_speculative.py tests/abi/test_triton_draws.py tests/gpu/test_ops_cuda.py tests/abi/test_sampling.py \
  tests/gpu/test_prompt_sharing_cuda.py "tests/gpu/test_fused_cuda.py::test_gelu_tanh_mul_in_a_graph" \
  tests/ignition/test_cuda.py > "$out/gpu_tests.log" 2>&1
echo "== gpu tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -15 | cut -c1-300
timeout 35 python3 .anchor/draw_bench.py 2>&1 | grep -v Warn | tee "$out/draw_bench.log" | grep -E "tokens:|Traceback|Error" | head -5
timeout $((275 - SECONDS)) python3 .anchor/spec_bench.py 2>&1 | grep -v Warn | tee "$out/spec_bench.log" | grep -E "checks:|R=  1|Traceback|Error" | head -12
echo "== benches done at ${SECONDS}s"
