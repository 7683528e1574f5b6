#!/usr/bin/env bash
# session 20 call 3: GPU tests of the merged main (decode kernel + rotary fusion, greedy graphs rewrite, staged kept values):
# the served path as merged (fusion off) and, in a second tree beside it, with FUSE_AT_CAPTURE on.
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
rm -rf /tmp/fused && mkdir -p /tmp/fused && cp -r src tests /tmp/fused/ && cp pyproject.toml /tmp/fused/
sed -i 's/^FUSE_AT_CAPTURE = False/FUSE_AT_CAPTURE = True/' /tmp/fused/src/helios/runtime/loading/rotary_calls.py
grep -n "^FUSE_AT_CAPTURE" /tmp/fused/src/helios/runtime/loading/rotary_calls.py
common="-q -p no:cacheprovider -ra --tb=short -p no:logging"
( export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
  timeout 170 python3 -m pytest $common -n 7 tests/abi/test_triton_decode.py tests/abi/test_triton_decode_heads.py \
   tests/abi/test_triton_decode_combine.py tests/abi/test_attention_sinks.py tests/abi/test_sampling_rows.py tests/abi/test_triton_sampling.py \
   tests/gpu/test_greedy_rows_cuda.py tests/gpu/test_host_staging_cuda.py tests/gpu/test_logprobs_cuda.py tests/gpu/test_runtime_cuda.py \
   > "$out/logs/as_merged.log" 2>&1; echo "as merged: exit $?" >> "$out/logs/as_merged.log" ) &
( cd /tmp/fused && export PYTHONPATH=/tmp/fused/src:/tmp/fused/tests:/tmp/site PYTHONUNBUFFERED=1
  timeout 170 python3 -m pytest $common -n 7 tests/abi/test_rotary_attention.py tests/gpu/test_runtime_cuda.py \
   tests/gpu/test_attention_sinks_cuda.py tests/gpu/test_moe_cuda.py tests/gpu/test_example_core_cuda.py tests/gpu/test_latent_cuda.py \
   > "$out/logs/fused.log" 2>&1; echo "fused: exit $?" >> "$out/logs/fused.log" ) &
wait
for f in as_merged fused; do echo "== $f"; grep -E "^FAILED|^ERROR|passed|failed|exit " "$out/logs/$f.log" | tail -n 25; done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
