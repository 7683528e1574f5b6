#!/usr/bin/env bash
# session 56: the race fix's checks, the new families' CUDA check and the changed kernels (softcap, moe route), then spec_bench
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --durations=10 \
  tests/abi/test_triton_speculative.py tests/abi/test_triton_draws.py tests/gpu/test_ops_cuda.py tests/abi/test_sampling.py \
  tests/gpu/test_prompt_sharing_cuda.py tests/gpu/test_families_cuda.py tests/abi/test_attention_softcap.py \
  tests/abi/test_triton_moe.py tests/gpu/test_moe_cuda.py tests/abi/test_triton_attention.py tests/ignition/test_cuda.py > "$out/gpu_tests.log" 2>&1
echo "== gpu tests rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -30 | cut -c1-300
timeout $((440 - SECONDS)) python3 .anchor/spec_bench.py 2>&1 | grep -v Warn | tee "$out/spec_bench.log" | grep -E "checks:|R=  1|Traceback|Error" | head -12
echo "== done at ${SECONDS}s"
