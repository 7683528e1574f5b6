#!/usr/bin/env bash
# session 33 call 2: the 4-layer random Llama on the device host's CPU (one thread, the C++ kernels bound by
# default against the Python bodies and transformers), then every gpu-marked test (bench/gpu_suite.sh)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 150 python3 bench/generate_vs_hf.py --models llama4,embedded --repeats 5 --bodies \
  > "$out/cpu_vs_hf.log" 2>&1
echo "== cpu rc $? at ${SECONDS}s"; grep -v Loading "$out/cpu_vs_hf.log" | tail -6 | cut -c1-300
BUDGET=$((585 - SECONDS)) OUT=$out bash bench/gpu_suite.sh 6
echo "== suite done at ${SECONDS}s"
