#!/usr/bin/env bash
# Issue 18, kernels and startup, in one device call on one H200 (about 7-8 minutes), logs under $OUT:
#   1. GPU tests: the attention kernels on CUDA (decode splits over each token's span, tiles, GQA,
#      CUDA graph replay at 8B shapes), the sinks variant, CPU-vs-CUDA greedy tokens, and program
#      capture in worker processes;
#   2. bench/decode_attention.py --prefill: old vs new decode kernel (and FlashInfer if importable)
#      at batches 1/64/256 x contexts 256/1k/4k with a tile and split sweep, roofline fractions, and
#      the prefill kernel's tile sweep; suggested DECODE_TILES / PREFILL_TILES entries at the end;
#   3. bench/ttft_breakdown.py: TTFT of 2,048 tokens cold and 90% cached, host vs program time, the
#      program time per prefill capacity (128/256/512/1024/2048), the prefill step's kernels by kind;
#   4. bench/cold_start.py: prepare and load phase by phase, with and without the logprobs variants.
# Run from the repository root with `.whl` carried:  bash bench/kernels_session.sh
# TTFT_LAYERS (default 32) and COLD_LAYERS (default 16) make the models shallower; each step's time
# limit is cut to what is left of BUDGET seconds (default 470), so the call ends in time.
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
budget=${BUDGET:-470}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 10)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 10 ? left : 10) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c 'import flashinfer; print("flashinfer", flashinfer.__version__)' 2>/dev/null || echo "flashinfer: not installed"

timeout "$(limit 90)" python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=80 \
  tests/abi/test_triton_decode.py tests/abi/test_triton_attention.py tests/abi/test_attention_sinks.py \
  tests/ignition/test_capture_pool.py 2>&1 | tee "$out/gpu_tests.log" | tail -6
timeout "$(limit 60)" python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=50 tests/gpu/test_runtime_cuda.py \
  -k "greedy_tokens_on_cuda and graphs and (llama or gpt_oss or mistral)" 2>&1 | tee "$out/greedy_tests.log" | tail -4
echo "[tests done at ${SECONDS}s]"
timeout "$(limit 170)" python3 bench/decode_attention.py --prefill --json "$out/decode_attention.json" 2>&1 \
  | tee "$out/decode_attention.log" | grep -v "^  tile" | tail -75
echo "[decode attention done at ${SECONDS}s]"
timeout "$(limit 110)" python3 bench/ttft_breakdown.py --layers "${TTFT_LAYERS:-32}" --json "$out/ttft.json" 2>&1 \
  | tee "$out/ttft.log" | grep -v "^ " | tail -16
echo "[ttft done at ${SECONDS}s]"
timeout "$(limit 200)" python3 bench/cold_start.py --layers "${COLD_LAYERS:-16}" --json "$out/cold_start.json" 2>&1 \
  | tee "$out/cold_start.log" | tail -32
echo "[cold start done at ${SECONDS}s]"
