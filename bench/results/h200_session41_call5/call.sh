#!/usr/bin/env bash
# session 41 call 5: bench/power_floor.py after its graph capture and sustained timing moved onto
# bench/lever_ab.captured_graph and gemm_algos.sustained_replay_us (against call 4's JSON)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 300 python3 bench/power_floor.py --rows 256 --sustain-s 4 --rounds 3 --anchor-json .anchor/call4_anchor_compare.json 2>&1 | tee "$out/power_floor.log"
echo "== done at ${SECONDS}s"
