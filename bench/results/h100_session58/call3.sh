#!/usr/bin/env bash
# Session 58, call 3: the three family checks that failed in call 2 (DeepSeek-V3.2 and GLM-5 after the
# index-key-write fix e4772acd; Llama 4 again), Llama 4 bisected (llama4_bisect.py), then the hybrid state
# tests that errored in call 2 for want of the `kernels` package transformers 5.25 asks for on CUDA.
# Run from the repository root with .whl carried:  OUT=dir bash bench/results/h100_session58/call3.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-tests
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -v -p no:cacheprovider -rfEs -n 3 --dist load --tb=short \
  -k "llama4 or glm_moe_dsa or deepseek_v32" tests/gpu/test_families_cuda.py > "$out/families.log" 2>&1
echo "== families rc $? at ${SECONDS}s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$out/families.log" | tail -6 | cut -c1-300
timeout 130 python3 bench/results/h100_session58/llama4_bisect.py > "$out/bisect.log" 2>&1
echo "== bisect rc $? at ${SECONDS}s"; grep -v Warning "$out/bisect.log" | tail -12 | cut -c1-400
timeout $((350 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 --dist loadfile --tb=short -m gpu \
  tests/gpu/test_state_graphs_cuda.py tests/gpu/test_hybrid_cuda.py tests/gpu/test_hybrid_state_cuda.py \
  tests/gpu/test_hybrid_cuda_isolation.py > "$out/hybrid.log" 2>&1
echo "== hybrid rc $? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/hybrid.log" | tail -12 | cut -c1-300
