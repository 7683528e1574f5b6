#!/usr/bin/env bash
# Issue 18, the host side of a decode cohort at 256 rows on the device machine, one call (at most
# BUDGET seconds, default 420), logs under $OUT:
#   GPU tests (pytest -n 6, first): the runtime served from CUDA graphs against the CPU path (two
#      frames, page tables staged), token log-probabilities, host staging, the example core;
#   1. bench/cohort_host_ab.py --device cuda: a 4-layer random Llama (hidden 256) loaded onto the GPU
#      with CUDA graphs and two execution frames, 64 and 256 greedy requests, the previous host bodies
#      and the current ones alternated in one process: thread CPU per full decode step, by phase
#      (schedule, pack, graph launch, finish with its wait, results validation, complete, events);
#   2. bench/cohort_host_ab.py on the device host's CPU (eager CPU programs, one thread) at 16 and 256
#      rows: the same A/B on that machine's cores.
# Run from the repository root:  OUT=dir bash bench/cohort_session.sh
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
budget=${BUDGET:-420}
limit() {  # the smaller of $1 and the seconds left of the budget (at least 5)
  local left=$((budget - SECONDS))
  echo $(( $1 < left ? $1 : (left > 5 ? left : 5) ))
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

timeout "$(limit 120)" python3 -m pytest -q -x -p no:cacheprovider -n 6 tests/gpu/test_runtime_cuda.py \
  tests/gpu/test_logprobs_cuda.py tests/gpu/test_host_staging_cuda.py tests/gpu/test_example_core_cuda.py \
  > "$out/gpu_tests.log" 2>&1
echo "gpu tests: exit $? at ${SECONDS}s"

timeout "$(limit 200)" python3 bench/cohort_host_ab.py --device cuda --batches 64,256 --repeats 5 \
  > "$out/cohort_host_ab_cuda.log" 2>&1
echo "cohort_host_ab cuda: exit $? at ${SECONDS}s"

timeout "$(limit 150)" python3 bench/cohort_host_ab.py --batches 16,256 --repeats 5 --layers 1 \
  > "$out/cohort_host_ab_cpu.log" 2>&1
echo "cohort_host_ab cpu: exit $? at ${SECONDS}s"

echo "== summary"
tail -3 "$out/gpu_tests.log"
for log in "$out/cohort_host_ab_cuda.log" "$out/cohort_host_ab_cpu.log"; do
  grep -E "^batch|^  (step|host|schedule|pack|results|complete|other) " "$log"
done
echo "[done at ${SECONDS}s]"
