#!/usr/bin/env bash
# session 35 call 2 (the machine still warm from call 1, its wheels installed and the kernels built;
# 108 s of device time left): the CPU attention kernel against its previous path on the Xeon host
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 85 python3 bench/cpu_attention_ab.py --rounds 7 --calls 50 \
  --shapes llama4-b16,embedded-b16,embedded-b16-long,g1-d64,g2-d128,g4-d128,g8-d32 2>&1 | grep -v W1203 | tee $OUT/cpu_attention_ab.log
