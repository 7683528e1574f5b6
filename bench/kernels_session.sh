#!/usr/bin/env bash
# Issue 18, kernels and startup, in one device call on one H200 (at most BUDGET seconds, default 530),
# logs under $OUT:
#   1. GPU tests of the decode kernels (tests/abi/test_triton_decode.py, test_triton_decode_combine.py
#      and test_attention_sinks.py on CUDA: splits over each token's span, one-split grids, tiles, GQA,
#      windows, sinks, the single-launch combine replayed over new spans from a CUDA graph at 8B shapes,
#      and the ops replayed in a CUDA graph with new step data);
#   2. bench/decode_attention.py: the previous decode kernel vs the current one at batches 1/64/256 x
#      contexts 128/256/1k with its per-batch sweep of tiles, prefetch levels, combines and split
#      counts (about 45 variants, compiled side by side first), a summary, the suggested table entries
#      and each suggestion timed as served (under 120 s);
#   3. bench/cold_start.py: prepare and load of a COLD_LAYERS-layer (default 32) 8B-shaped core with
#      the logprobs variants, phase by phase; the core is kept for step 4;
#   4. bench/ttft_breakdown.py --core: TTFT of 2,048 tokens cold and 90% cached on that core (loaded
#      without the logprobs variants), program vs host time, per prefill capacity, kernels by kind.
#      Without a kept core (step 3 killed) it prepares its own TTFT_LAYERS-layer core (default 32).
# Run from the repository root with `.whl` carried:  bash bench/kernels_session.sh
# COLD_ONLY=1 runs steps 3 and 4 only, DECODE_ONLY=1 steps 1 and 2 only; COLD_LIMIT / TTFT_LIMIT
# (240 / 170 s) cap steps 3 and 4.
# Each step's time limit is cut to what is left of BUDGET seconds, so the call ends in time.
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
budget=${BUDGET:-530}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 10)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 10 ? left : 10) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
echo "[setup done at ${SECONDS}s]"

if [ "${COLD_ONLY:-0}" = 1 ]; then  # steps 3 and 4 only (cold start and TTFT)
  echo "[steps 1-2 skipped: COLD_ONLY=1]"
else
timeout "$(limit 180)" python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=175 \
  tests/abi/test_triton_decode.py tests/abi/test_triton_decode_combine.py tests/abi/test_attention_sinks.py \
  "tests/abi/test_triton_attention.py::test_cuda_ops_replay_in_a_cuda_graph_with_new_step_data" 2>&1 | tee "$out/gpu_tests.log" | tail -6
echo "[tests done at ${SECONDS}s]"
timeout "$(limit 170)" python3 bench/decode_attention.py --json "$out/decode_attention.json" 2>&1 \
  | tee "$out/decode_attention.log" | grep -v "^  tile" | tail -75
echo "[decode attention done at ${SECONDS}s]"
fi
[ "${DECODE_ONLY:-0}" = 1 ] && exit 0
kept=/tmp/helios-kept-core
rm -rf "$kept"
timeout "$(limit ${COLD_LIMIT:-240})" python3 bench/cold_start.py --layers "${COLD_LAYERS:-32}" --variants logprobs \
  --skip-no-logprobs-load --keep-core "$kept" --json "$out/cold_start.json" 2>&1 | tee "$out/cold_start.log" | tail -40
echo "[cold start done at ${SECONDS}s]"
core_args=(--layers "${TTFT_LAYERS:-32}")
[ -f "$kept/model.core" ] && core_args=(--core "$kept")
timeout "$(limit ${TTFT_LIMIT:-170})" python3 bench/ttft_breakdown.py "${core_args[@]}" --repeats 3 --json "$out/ttft.json" 2>&1 \
  | tee "$out/ttft.log" | grep -v "^ " | tail -16
echo "[ttft done at ${SECONDS}s]"
rm -rf "$kept"
