#!/usr/bin/env bash
# Issue 18, the host side of GPU decode, in one device call on one H200 (at most BUDGET seconds,
# default 195), logs under $OUT:
#   1. bench/decode_host_ab.py at 8 layers of the 8B shape: the compiled anchor ($ANCHOR, batches
#      256, 64, 1; it runs while Helios prepares, Helios measures after it exits), then Helios at the
#      same shapes (128-token prompts, 128 greedy tokens) with the rewritten greedy graphs ("new":
#      counts read through the slots, padding rows skipped, the bias added in place) and with the
#      greedy graphs as before ("old"), alternating, two rounds; each step's device ms and the
#      device's idle ms before it (CUDA events), the host's ms per engine step by phase; one-frame
#      runs (no overlap) beside them;
#   GPU tests (pytest -n 4, first, while the checkpoint is written and the core prepares; the anchor
#      waits for them): the slot-indexed greedy kernel, the rewritten graphs served from CUDA graphs
#      against the CPU path, the sampling kernel tests (the float32 lanes' ties among them);
#   2. bench/greedy_ab.py: the greedy pass at 1/64/256 rows of the 8B vocabulary (float64 rows, the
#      float32 lanes, split counts, rows masked as served, half of them padding).
# Run from the repository root:  OUT=dir ANCHOR=path/compiled_anchor.py bash bench/dhost3_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
budget=${BUDGET:-195}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 5)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 5 ? left : 5) ))
}
anchor=${ANCHOR:-../shared/bench/compiled_anchor.py}
layers=${LAYERS:-8}
# Deeper than 8 layers the anchor does not fit beside Helios in the budget (32 layers: 212 s alone):
# its rates then come from the anchor comparison of main at baa76f0 (results/s20call1, 32 layers).
anchor_args=(--anchor "$anchor" --anchor-seconds 130)
if [ "$layers" -gt 8 ]; then
  anchor_args=(--anchor-seconds 0 --anchor-reference "256:23513.1,64:10305.9,1:189.3")
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

# The GPU tests run first, beside the checkpoint writing and Helios preparation; the anchor after them.
timeout "$(limit 175)" python3 bench/decode_host_ab.py --layers "$layers" "${anchor_args[@]}" \
  --rounds 2 --tests-timeout 50 --tests-log "$out/gpu_tests.log" --json "$out/decode_host_ab.json" \
  --tests "-n 4 -ra tests/abi/test_sampling_rows.py tests/gpu/test_greedy_rows_cuda.py tests/abi/test_triton_sampling.py" \
  > "$out/decode_host_ab.log" 2>&1
echo "decode_host_ab: exit $? at ${SECONDS}s"

timeout "$(limit 25)" python3 bench/greedy_ab.py --rows 1,64,256 > "$out/greedy_ab.log" 2>&1
echo "greedy_ab: exit $? at ${SECONDS}s"

echo "== summary"
grep -E "^tests|^anchor|^loaded|^prepared" "$out/decode_host_ab.log"
grep -E "^SUMMARY|^STEPS|^one frame" "$out/decode_host_ab.log"
grep -E "^greedy R=" "$out/greedy_ab.log"
grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -3
echo "[done at ${SECONDS}s]"
