#!/usr/bin/env bash
# session 42 call 6: the 8B core's load to ready in fresh processes, as `helios serve` loads it (this tree on both
# sides of bench/load_ab.sh: two empty-Triton-cache loads per side, then two warm-cache loads per side)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
OLD_SRC=src OUT="$out" timeout 560 bash bench/load_ab.sh 2 2>&1 | tee "$out/load_ab.txt"
echo "== done at ${SECONDS}s"
