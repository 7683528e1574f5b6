#!/usr/bin/env bash
# session 41 call 8: the step's products alone on random rows and on one row repeated (the data a replay on
# padding rows computes): is the power cap's bite data-dependent?
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 300 python3 bench/power_floor.py --rows 256 --sustain-s 3 --rounds 2 --alike-rows 2>&1 | tee "$out/power_floor.log"
echo "== done at ${SECONDS}s"
