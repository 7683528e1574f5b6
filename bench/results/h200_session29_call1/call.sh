#!/usr/bin/env bash
# session 29 call 1: PDL A/B on a 64-row layer chain, then cold start A sampled and B
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-p timeout 150 python3 bench/pdl_ab.py --prefetch 256,512,1024 > "$out/logs/pdl_ab.log" 2>&1
echo "== pdl exit $? at ${SECONDS}s"; tail -25 "$out/logs/pdl_ab.log"
show() { grep -iE "^load \(|Triton kernels|program modules|weights|load_model|plans|stand-ins|dry run|capture|waiting|imports ahead" "$1" | grep -v "captured " | head -20; }
TRITON_CACHE_DIR=/tmp/triton-a timeout 200 python3 bench/cold_start.py --layers 32 --variants logprobs --sample \
  --skip-no-logprobs-load --keep-core /tmp/core8b --json "$out/logs/cold_start_a.json" > "$out/logs/cold_start_a.log" 2>&1
echo "== A exit $? at ${SECONDS}s"; show "$out/logs/cold_start_a.log"
sed -n '/load (logprobs): the stage/,/Triton compiles/p' "$out/logs/cold_start_a.log" | head -48
TRITON_CACHE_DIR=/tmp/triton-b timeout 100 python3 bench/cold_start.py --core /tmp/core8b --variants logprobs --sample \
  --json "$out/logs/cold_start_b.json" > "$out/logs/cold_start_b.log" 2>&1
echo "== B exit $? at ${SECONDS}s"; show "$out/logs/cold_start_b.log"
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
