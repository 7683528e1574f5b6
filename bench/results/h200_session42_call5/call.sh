#!/usr/bin/env bash
# session 42 call 5: the one-row output projection with its weight asked into L2 during an attention stand-in
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 200 python3 bench/l2_prefetch_ab.py --layers 32 2>&1 | tee "$out/l2_prefetch_ab.log" | cut -c1-300
timeout 150 python3 bench/l2_prefetch_ab.py --layers 32 --spacer-us 4 --rounds 2 2>&1 | tee "$out/l2_prefetch_ab_4us.log" | tail -14 | cut -c1-300
echo "== done at ${SECONDS}s"
