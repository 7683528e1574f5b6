#!/usr/bin/env bash
# session 35 call 1 (300 s of device time left): the CPU attention kernel's blocked scores on the Xeon host:
# the kernel against its previous path at each shape, then in a 4-layer Llama engine at batch 16
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
echo "== installed at ${SECONDS}s"; lscpu | grep -i "model name"
CUDA_VISIBLE_DEVICES= timeout 45 python3 bench/cpu_attention_ab.py --rounds 9 > "$out/cpu_attention_ab.log" 2>&1
echo "== kernel ab rc $? at ${SECONDS}s"; cat "$out/cpu_attention_ab.log"
CUDA_VISIBLE_DEVICES= timeout 50 python3 bench/cpu_attention_ab.py --engine llama4 --repeats 5 > "$out/cpu_attention_engine.log" 2>&1
echo "== engine ab rc $? at ${SECONDS}s"; grep -v Warn "$out/cpu_attention_engine.log" | tail -4
