#!/usr/bin/env bash
# The next device call (session 58 spent its device time in calls 1-3): DeepSeek-V3.2's and GLM-5's CUDA
# checks after the index-key-write fix (e4772acd) and Llama 4's unfused capture (460420fa), the Llama 4
# bisection with the fusion forced back on (llama4_bisect.py), then every gpu-marked test (bench/gpu_suite.sh:
# the family checks spread over the workers). The wheels: ../shared/device/fetch-wheels.sh's set plus
# transformers==5.25.0, huggingface_hub==2.4.0, kernels==0.19.1, typer, click (as this session's .whl; the
# carry limit is 64 MiB with the tree: leave out what the device has, e.g. pillow, tiktoken, hf_xet).
# Run from the repository root with .whl carried:  OUT=dir bash bench/results/h100_session58/next_call.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-tests
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -v -p no:cacheprovider -rfEs -n 3 --dist load --tb=short \
  -k "llama4 or glm_moe_dsa or deepseek_v32" tests/gpu/test_families_cuda.py > "$out/families3.log" 2>&1
echo "== three families rc $? at ${SECONDS}s"; grep -E "^(FAILED|ERROR) |passed|failed" "$out/families3.log" | tail -6 | cut -c1-300
timeout 150 python3 bench/results/h100_session58/llama4_bisect.py > "$out/bisect.log" 2>&1
echo "== bisect rc $? at ${SECONDS}s"; grep -E "first differences|Error" "$out/bisect.log" | tail -8 | cut -c1-300
BUDGET=$((585 - SECONDS)) OUT=$out/suite bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
