#!/usr/bin/env bash
# Cold time to first token with the fresh-chunk attention (issue 18), this tree against main's, in one
# device call on one H200, at most about 185 s.
#
# NEEDS: MAIN_TREE=<a checkout of main's tree> in the environment (the lead puts it there); without it
# only this tree is measured (no A/B).
#
# - GPU tests (-n 6, at most 100 s): the fresh-chunk op against the paged kernel at 8B shapes per SDPA
#   backend, in a CUDA graph, a bfloat16 core served with fresh graphs; the op's kernels (rotary with
#   stored keys, padding zeros) compiled; the fused kernels; the runtime on CUDA (float32 Llama with
#   graphs against the CPU path's tokens, bfloat16, released graphs);
# - bench/ttft_host.py in two processes on the same device: this tree ("prefill4") prepares the 32-layer
#   8B-shaped core and shares it, main's tree ("main", PYTHONPATH=$MAIN_TREE/src) loads it; once the tests
#   are done they take turns request by request (9 cold 2,048-token prompts each, alternating): cold
#   TTFT, host phases, the program's device time (CUDA events), first tokens, KV cache checksums (equal:
#   the fresh path writes the planes the paged path writes); then, in this tree's process alone, 7 + 7
#   cold requests alternating its fresh-chunk graphs on and off (same core, pool and process);
# - bench/fresh_attention_ab.py (at most 45 s): per layer, rotary + cache write + attention of a cold
#   chunk of 2,048 / 1,024 tokens, paged (as main serves it) against the fresh op per SDPA backend, on
#   consecutive and shuffled pages, and the attention kernels alone.
# Logs under $OUT: prefill4_session.log, ttft_host_prefill4.json, ttft_host_main.json,
# fresh_attention_ab.{log,json}.
# Run from the repository root:  OUT=dir MAIN_TREE=dir bash bench/prefill4_session.sh   (LAYERS=4: quick;
# SMOKE=1 on a machine without CUDA: checks the script runs)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
started=$SECONDS
scratch=$(mktemp -d)
log="$out/prefill4_session.log"
extra=()
[ -n "${SMOKE:-}" ] && extra=(--smoke)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | tee "$log"
tests=(tests/gpu/test_fresh_attention_cuda.py tests/abi/test_fresh_attention.py tests/abi/test_triton_fused.py
       tests/runtime/test_fresh_calls.py tests/runtime/test_captured_program.py)
runtime=tests/gpu/test_runtime_cuda.py
[ -z "${SMOKE:-}" ] && tests+=("$runtime::test_float32_greedy_tokens_on_cuda_equal_the_cpu_path[llama3-graphs]"
                               "$runtime::test_bfloat16_core_on_cuda_stays_close_to_the_float32_cpu_path"
                               "$runtime::test_released_graphs_refuse_to_replay")
( if [ -n "${SMOKE:-}" ]; then
    timeout 100 $python -m pytest -q -p no:cacheprovider -x -ra tests/abi/test_fresh_attention.py > "$scratch/tests.log" 2>&1
  else
    timeout 100 $python -m pytest -q -p no:cacheprovider -n 6 -ra --tb=short -o faulthandler_timeout=90 "${tests[@]}" \
      > "$scratch/tests.log" 2>&1
  fi
  echo "exit $?" >> "$scratch/tests.log"; touch "$scratch/tests.done" ) &
testing=$!
common=(--layers "${LAYERS:-32}" --repeats 9 --baton "$scratch/baton" --wait "$scratch/tests.done" --wait-s 105
        "${extra[@]}")
timeout 150 $python bench/ttft_host.py "${common[@]}" --role a --label prefill4 --share-core "$scratch/core" --fresh-ab 7 \
  --json "$out/ttft_host_prefill4.json" > "$scratch/prefill4.log" 2>&1 &
mine=$!
theirs=""
if [ -n "${MAIN_TREE:-}" ] && [ -d "$MAIN_TREE/src/helios" ]; then
  PYTHONPATH=$MAIN_TREE/src:$PWD/tests:/tmp/site timeout 150 $python bench/ttft_host.py "${common[@]}" --role b \
    --label main --use-core "$scratch/core" --json "$out/ttft_host_main.json" > "$scratch/main.log" 2>&1 &
  theirs=$!
else
  echo "no MAIN_TREE: this tree alone" | tee -a "$log"
fi
wait $mine
[ -n "$theirs" ] && wait $theirs
wait $testing
timeout 45 $python bench/fresh_attention_ab.py --tokens 2048,1024 --json "$out/fresh_attention_ab.json" "${extra[@]}" \
  > "$out/fresh_attention_ab.log" 2>&1
echo "exit $?" >> "$out/fresh_attention_ab.log"
{ echo "=== GPU tests"; grep -v "PytestBenchmarkWarning\|warner(" "$scratch/tests.log" | tail -25
  for name in prefill4 main; do
    [ -f "$scratch/$name.log" ] || continue
    echo "=== bench/ttft_host.py ($name)"
    grep -v "checkpoint: layer\|FutureWarning\|return cls\|UserWarning\|_warn_once" "$scratch/$name.log" | tail -16
  done; } >> "$log"
$python - "$out" >> "$log" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {name: json.loads((out / f"ttft_host_{name}.json").read_text())
        for name in ("prefill4", "main") if (out / f"ttft_host_{name}.json").exists()}
if len(runs) == 2:
    a, b = runs["prefill4"]["medians_ms"], runs["main"]["medians_ms"]
    print("=== this tree (prefill4) against main, medians of alternating cold requests")
    for key in ("ttft", "device", "host", "admit", "schedule", "prepack", "pack", "call", "launch"):
        if key in a and key in b:
            print(f"  {key:<9} prefill4 {a[key]:8.3f} ms   main {b[key]:8.3f} ms   saved {b[key] - a[key]:+7.3f} ms")
    same = runs["prefill4"]["tokens"] == runs["main"]["tokens"]
    cache = runs["prefill4"]["cache_checksum"] == runs["main"]["cache_checksum"]
    print(f"  first tokens equal: {same}; KV cache checksums equal: {cache}")
PYEOF
{ echo "=== bench/fresh_attention_ab.py"; cat "$out/fresh_attention_ab.log"; } >> "$log"
rm -rf "$scratch"
echo "=== summary ($(( SECONDS - started )) s)"
grep -E "[0-9]+ (passed|failed|error)|^exit" "$log" | tail -4
sed -n '/=== bench\/ttft_host.py/,/=== bench\/fresh_attention_ab.py/p' "$log" | grep -E "cold TTFT|host before|saved|equal|fresh A/B|measuring alone|never got"
grep -E "^---|paged  |fresh |attention alone" "$out/fresh_attention_ab.log" | head -24
