#!/usr/bin/env bash
# session 30 call 3: 256-row candidates with the reduction mask as loaded (0x6) and with every scheme (0x7)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
for mask in 0x6 0x7; do
  timeout 100 python3 bench/cublaslt_ab.py --rows 256 --shapes gate_up,down,lm_head --show 3 --reductions $mask \
    2>&1 | grep -v Warning | tee "$out/logs/cublaslt_ab_$mask.log"
done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
