#!/usr/bin/env bash
# session 41 call 10: the 256-row down projection on a TMA split-K kernel with its reduction inside, against cuBLAS
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 150 python3 bench/wide_down_ab.py --rows 256 --sustain-ms 400 2>&1 | tee "$out/wide_down_ab.log" | cut -c1-300
echo "== done at ${SECONDS}s"
