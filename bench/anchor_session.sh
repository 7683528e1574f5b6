#!/usr/bin/env bash
# Issue 18 in one device call (one H200, about 7-8 minutes at 32 layers), logs under $OUT:
#   the new kernels' GPU tests and the CPU-vs-CUDA greedy token tests (while the checkpoint is
#   written and the core prepares), then the compiled anchor (.anchor/compiled_anchor.py, an ignored
#   copy of ../shared/bench/compiled_anchor.py) and Helios at the same shapes, the levers A/B and
#   the decode profile: bench/anchor_compare.py. Run from the repository root with `.anchor` and
#   `.whl` carried:  bash bench/anchor_session.sh      (LAYERS=4 for a quick run; WHEELS=dir for another
#   wheels' folder; .anchor/src.tgz, where present, is the src served)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
source bench/device_env.sh  # the wheels, `src` and PYTHONPATH
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 570 python3 bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers "${LAYERS:-32}" \
  --anchor-timeout 270 --json "$out/anchor_compare.json" \
  --tests "tests/gpu/test_fused_cuda.py tests/gpu/test_runtime_cuda.py -ra -o faulthandler_timeout=250
           -k 'in_a_graph or greedy_tokens_on_cuda or two_frames'" 2>&1 \
  | grep -v "checkpoint: layer" | tee "$out/anchor_compare.log" | tail -120
