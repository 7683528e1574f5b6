#!/usr/bin/env bash
# Issue 18, prefill attention, in one device call on one H200 (at most BUDGET seconds, default 400),
# logs under $OUT:
#   1. GPU tests of the prefill kernel (tests/abi/test_triton_prefill.py: Llama-8B head shapes, packed
#      and per-head tiles, splits, windows, padding over an uninitialised output, CUDA graph capture and
#      replay, consecutive pages through tensor descriptors) and of the attention ops
#      (test_triton_attention.py, test_attention_sinks.py) on CUDA, in five pytest processes side by
#      side (most of their time is Triton compiling; no pytest-xdist needed); logs
#      prefill_gpu_tests_{1..5}.log, a summary line each;
#   2. bench/prefill_attention.py: served vs packed and per-head tiles vs the old kernel vs SDPA's flash
#      kernel at 2,048 cold, 208 after 1,840 cached (also padded to its 256-token capacity), 512 and 128
#      cold, 128 after 1,920 cached, 2,048 cold on consecutive pages, with the best tile per case and the
#      suggested LONG_/SHORT_/PREFILL_TILES entries and split rule.
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
budget=${BUDGET:-400}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 10)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 10 ? left : 10) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
tests=(
  "tests/abi/test_triton_prefill.py -m gpu -k 'per_head or consecutive'"
  "tests/abi/test_triton_prefill.py -m gpu -k 'garbage or graph'"
  "tests/abi/test_triton_prefill.py -m gpu -k 'not per_head and not consecutive and not garbage and not graph'"
  "tests/abi/test_triton_prefill.py tests/abi/test_attention_sinks.py -m 'not gpu'"
  "tests/abi/test_triton_attention.py"
)
pids=()
for i in "${!tests[@]}"; do
  eval "timeout $(limit 170) python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=165 ${tests[$i]}" \
    >"$out/prefill_gpu_tests_$((i + 1)).log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; echo "tests $((i + 1)) (rc $?): ${tests[$i]}"
  tail -1 "$out/prefill_gpu_tests_$((i + 1)).log"
done
echo "[tests done at ${SECONDS}s]"
timeout "$(limit 150)" python3 bench/prefill_attention.py --json "$out/prefill_attention.json" 2>&1 \
  | tee "$out/prefill_attention.log"
echo "[prefill attention done at ${SECONDS}s]"
