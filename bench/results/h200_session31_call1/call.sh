#!/usr/bin/env bash
# session 31 call 1: clocks under sustained load; cuBLASLt candidates timed back to back at 256 rows; the anchor
# comparison with the 256-row choice timed back to back and the whole-step A/B sustained; SM clock per phase
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/tests/abi:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,power.max_limit --format=csv 2>&1 | tee "$out/logs/smi.txt"
timeout 45 python3 -m pytest -q -x tests/gpu/test_cublaslt_cuda.py 2>&1 | tail -3 | tee "$out/logs/tests.log"
timeout 110 python3 bench/cublaslt_ab.py --rows 256 --rounds 2 --sustain-ms 500 --show 4 2>&1 | grep -v Warning | tee "$out/logs/cublaslt_sustained.log"
echo "== probes done at ${SECONDS}s"
TRITON_CACHE_DIR=/tmp/triton-anchor timeout $((575 - SECONDS)) python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py \
  --layers 32 --top 30 --anchor-timeout 250 --rotary-fusion on --step-timing 256 --levers lt_program_ab \
  --gemm-rows 256,256 --gemm-sustain-ms 150 --sustain-ms 1000 \
  --json "$out/logs/anchor_compare.json" 2>&1 | grep -v "checkpoint: layer\|DEBUG\|captured " > "$out/logs/anchor_compare.log"
echo "== anchor done at ${SECONDS}s"
grep -iE "^\| |step timing|lt decode|cuBLASLt rows|loaded in|clocks|error|Traceback" "$out/logs/anchor_compare.log" | head -50 | cut -c1-400
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
