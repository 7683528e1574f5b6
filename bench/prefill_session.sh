#!/usr/bin/env bash
# Issue 18, prefill attention, in one device call on one H200 (at most BUDGET seconds, default 300),
# logs under $OUT:
#   1. GPU tests of the prefill kernel (tests/abi/test_triton_prefill.py: Llama-8B head shapes, splits,
#      windows, CUDA graph capture and replay) and of the attention ops (test_triton_attention.py,
#      test_attention_sinks.py) on CUDA;
#   2. bench/prefill_attention.py: old vs new prefill kernel vs SDPA's flash kernel at 2,048 cold,
#      208 after 1,840 cached (also padded to its 256-token capacity), 512 and 128 cold, with a tile
#      and split sweep and the suggested PREFILL_TILES entry and split rule.
# Run from the repository root (with `.whl` carried where the device lacks the wheels):
#   bash bench/prefill_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
budget=${BUDGET:-300}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 10)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 10 ? left : 10) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout "$(limit 150)" python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=145 \
  tests/abi/test_triton_prefill.py tests/abi/test_triton_attention.py tests/abi/test_attention_sinks.py 2>&1 \
  | tee "$out/prefill_gpu_tests.log" | tail -6
echo "[tests done at ${SECONDS}s]"
timeout "$(limit 150)" python3 bench/prefill_attention.py --json "$out/prefill_attention.json" 2>&1 \
  | tee "$out/prefill_attention.log"
echo "[prefill attention done at ${SECONDS}s]"
