#!/usr/bin/env bash
# Session 57's first device call: the strided-parameter fix of the draw kernels (8880b9a) on CUDA, the family
# checks the session-56 calls did not reach (GLM-4.7-Flash, dots.llm1, Youtu-LLM, the Gated DeltaNet hybrids),
# the new CUDA tests (layer_norm in a graph, the delta rule), then the rest of the GPU suite in what remains.
# Run from the repository root with .whl carried:  OUT=dir bash bench/results/h200_session56/next_call.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 240 python3 -m pytest -v --tb=short -p no:cacheprovider -rfEs -n 8 --dist loadfile \
  tests/gpu/test_prompt_sharing_cuda.py tests/abi/test_triton_draws_strides.py tests/gpu/test_delta_rule_cuda.py \
  tests/gpu/test_fused_cuda.py "tests/gpu/test_families_cuda.py" > "$out/first_tests.log" 2>&1
echo "== first tests rc $? at ${SECONDS}s"
grep -E "FAILED|ERROR| failed| passed" "$out/first_tests.log" | tail -30 | cut -c1-300
BUDGET=$((580 - SECONDS)) OUT=$out/suite bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
