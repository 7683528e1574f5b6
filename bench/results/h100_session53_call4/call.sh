#!/usr/bin/env bash
# session 53 call 4: every gpu-marked test (the done-when check after row-blocked sampling, grammar dead ends, rope checks), then the sampled op's cost of row blocks at 256 x 128k
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
BUDGET=390 bash bench/gpu_suite.sh 8
echo "== suite done at ${SECONDS}s"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
timeout $((560 - SECONDS)) python3 .anchor/sample_blocks.py 2>&1 | grep -v Warning | tail -4 | tee "$out/sample_blocks.log"
echo "== done at ${SECONDS}s"
