# session 52 call 3 (H100 80 GB, at 775d517): bench/load_memory.py at 0.85 then 0.93, live allocations by site at the out-of-memory moment
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/bench:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
TRITON_CACHE_DIR=/tmp/triton-mem timeout 300 python3 bench/load_memory.py --memory-fraction 0.85,0.93 --top 30 2>&1 \
  | grep -v "checkpoint: layer\|DEBUG\|FutureWarning\|isinstance(treespec" > "$out/load_memory.log"
echo "== done at ${SECONDS}s"
grep -E "GiB|load|out of memory|Error|again" "$out/load_memory.log" | tail -60 | cut -c1-300
timeout 170 python3 -m pytest -q -p no:cacheprovider -x -m gpu tests/gpu/test_kernel_precompile_cuda.py tests/gpu/test_runtime_cuda.py tests/gpu/test_example_core_cuda.py > "$out/gpu_tests.log" 2>&1
echo "== tests rc $? at ${SECONDS}s"; tail -5 "$out/gpu_tests.log" | cut -c1-300
