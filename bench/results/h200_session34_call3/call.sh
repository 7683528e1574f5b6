#!/usr/bin/env bash
# session 34 call 3: the packed projection kernel splitting calls over threads from 65,536 multiply-adds (was 2M):
# the CPU engine against transformers with four threads on both sides, and the kernel alone at four threads
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 120 python3 bench/generate_vs_hf.py --models llama4,embedded --repeats 3 --threads 4 \
  > "$out/cpu_vs_hf_threads4.log" 2>&1
echo "== cpu threads 4 rc $? at ${SECONDS}s"; grep -v Loading "$out/cpu_vs_hf_threads4.log" | tail -6 | cut -c1-300
for m in 65536 2097152; do
  CUDA_VISIBLE_DEVICES= timeout 40 python3 bench/linear_kernel_ab.py --shape llama4 --threads 4 --parallel-macs $m --rounds 9
done > "$out/linear_ab_threads4.log" 2>&1
echo "== linear ab rc $? at ${SECONDS}s"; grep -v W1203 "$out/linear_ab_threads4.log"
