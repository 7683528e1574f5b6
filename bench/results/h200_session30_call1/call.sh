#!/usr/bin/env bash
# session 30 call 1: cuBLAS's pick against cuBLASLt's heuristic candidates per 8B decode projection
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv | tee "$out/logs/smi.txt"
timeout 400 python3 bench/cublaslt_ab.py --rows 1,64,256 --candidates 24 --show 5 2>&1 | tee "$out/logs/cublaslt_ab.log"
echo "== done at ${SECONDS}s"
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
