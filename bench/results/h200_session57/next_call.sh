#!/usr/bin/env bash
# The next device call (session 57 had no device time): the draw kernels' strided-parameter fix (8880b9a)
# on CUDA, the new CUDA paths of this session (the chunked attention Triton kernel, relu2 experts in the MoE
# kernels, DeepSeek Sparse Attention's torch ops in CUDA graphs) and every family's CUDA check (64
# architectures, 23 of them new this session), then the rest of the GPU suite in what remains.
# Run from the repository root with .whl carried:  OUT=dir bash bench/results/h200_session57/next_call.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-tests timeout 300 python3 -m pytest -v --tb=short -p no:cacheprovider -rfEs -n 8 --dist loadfile \
  tests/gpu/test_prompt_sharing_cuda.py tests/abi/test_triton_draws_strides.py tests/abi/test_attention_chunked.py \
  tests/abi/test_sparse_index.py tests/abi/test_triton_moe.py tests/gpu/test_delta_rule_cuda.py \
  tests/gpu/test_fused_cuda.py tests/gpu/test_families_cuda.py > "$out/first_tests.log" 2>&1
echo "== first tests rc $? at ${SECONDS}s"
grep -E "FAILED|ERROR| failed| passed" "$out/first_tests.log" | tail -40 | cut -c1-300
BUDGET=$((580 - SECONDS)) OUT=$out/suite bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
