#!/usr/bin/env bash
# session 45 call 2: the precompile's dry run making each repeated call of a plan once (dry_run_repeats):
# the CUDA tests of the load path (precompile in fresh processes: every variant the capture needs still found;
# bf16 runtime against the CPU path; greedy graphs), then the 8B load's A/B against every call made
# (OLD_SRC=src A_ARGS=--dry-run-every-call), fresh processes, empty then warm Triton caches
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
TRITON_CACHE_DIR=/tmp/triton-tests timeout 200 python3 -m pytest -p no:cacheprovider -n 8 -rA --tb=short \
  tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py \
  tests/gpu/test_greedy_rows_cuda.py > "$out/gpu_tests.log" 2>&1
echo "tests exit $? at ${SECONDS}s"; grep -E "passed|failed|^FAILED|^ERROR|^E  " "$out/gpu_tests.log" | head -20
OLD_SRC=src A_ARGS='--dry-run-every-call' OUT=$out bash bench/load_ab.sh 2 > "$out/load_ab.txt" 2>&1
cat "$out/load_ab.txt"
mkdir -p "$out/l" && tar -xzf "$out/load_ab_logs.tgz" -C "$out/l" && for f in "$out"/l/logs/*_*.log; do
  echo "$(basename $f): $(grep -m1 -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') plans $(grep -oE 'capture plans \(graph modules, beside the weights\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$') | $(grep -oE 'then [0-9.]+ s at capture \([0-9]+ repeated' $f)"
done; rm -rf "$out/l"
echo "== done at ${SECONDS}s"
