#!/usr/bin/env bash
# session 34 call 1: the embedded model and the 4-layer random Llama on the device host's CPU (the C++ kernels
# with the packed projections by default, against the Python bodies and transformers; one thread, then four),
# then every gpu-marked test (bench/gpu_suite.sh)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3" > "$out/cpu.txt"
CUDA_VISIBLE_DEVICES= timeout 170 python3 bench/generate_vs_hf.py --models llama4,embedded --repeats 5 --bodies \
  > "$out/cpu_vs_hf.log" 2>&1
echo "== cpu rc $? at ${SECONDS}s"; grep -v Loading "$out/cpu_vs_hf.log" | tail -6 | cut -c1-300
CUDA_VISIBLE_DEVICES= timeout 120 python3 bench/generate_vs_hf.py --models llama4,embedded --repeats 3 --threads 4 \
  > "$out/cpu_vs_hf_threads4.log" 2>&1
echo "== cpu threads 4 rc $? at ${SECONDS}s"; grep -v Loading "$out/cpu_vs_hf_threads4.log" | tail -6 | cut -c1-300
CUDA_VISIBLE_DEVICES= timeout 60 python3 bench/linear_kernel_ab.py --shape llama4 > "$out/linear_ab.log" 2>&1
CUDA_VISIBLE_DEVICES= timeout 60 python3 bench/linear_kernel_ab.py --shape 8b --rows 1,16,64 --rounds 5 --threads 8 \
  >> "$out/linear_ab.log" 2>&1
echo "== linear ab rc $? at ${SECONDS}s"; cat "$out/linear_ab.log"
BUDGET=$((585 - SECONDS)) OUT=$out bash bench/gpu_suite.sh 6
echo "== suite done at ${SECONDS}s"
