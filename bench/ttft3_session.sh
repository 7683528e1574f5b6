#!/usr/bin/env bash
# Host time before a cold prefill's launch (issue 18), this tree against main's, in one device call
# on one H200, at most about 190 s.
#
# NEEDS: MAIN_TREE=<a checkout of main's tree> in the environment (the lead puts it there); without it
# only this tree is measured (no A/B).
#
# - GPU tests (-n 6, at most 110 s): the runtime on CUDA (greedy tokens against the CPU path, the soak
#   that allocates nothing once warm, two frames, penalties), prompt sharing, host staging,
#   initialization and state graphs: the packer's staging and the step arena on the device;
# - bench/ttft_host.py in two processes on the same device: this tree ("ttft3") prepares the 32-layer
#   8B-shaped core and shares it, main's tree ("main", PYTHONPATH=$MAIN_TREE/src) loads it; once the
#   tests are done they take turns request by request (9 cold 2,048-token prompts each, alternating):
#   cold TTFT, host phases before the program call, the program's device time (CUDA events), the
#   first tokens and a checksum of the KV cache after the same requests (equal: the prefills wrote the
#   same values).
# Logs under $OUT: ttft3_session.log, ttft_host_ttft3.json, ttft_host_main.json.
# Run from the repository root:  OUT=dir MAIN_TREE=dir bash bench/ttft3_session.sh   (LAYERS=4: quick;
# EXTRA="--smoke" on a machine without CUDA: checks the script runs)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
started=$SECONDS
scratch=$(mktemp -d)
log="$out/ttft3_session.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$log"
( timeout 110 python3 -m pytest -q -p no:cacheprovider -n 6 -ra -o faulthandler_timeout=100 \
    tests/gpu/test_runtime_cuda.py tests/gpu/test_prompt_sharing_cuda.py tests/gpu/test_host_staging_cuda.py \
    tests/gpu/test_initialization_cuda.py tests/gpu/test_state_graphs_cuda.py \
    > "$scratch/tests.log" 2>&1
  echo "exit $?" >> "$scratch/tests.log"; touch "$scratch/tests.done" ) &
tests=$!
common=(--layers "${LAYERS:-32}" --repeats 9 --baton "$scratch/baton" --wait "$scratch/tests.done" --wait-s 115 ${EXTRA:-})
timeout 180 python3 bench/ttft_host.py "${common[@]}" --role a --label ttft3 --share-core "$scratch/core" \
  --json "$out/ttft_host_ttft3.json" > "$scratch/ttft3.log" 2>&1 &
mine=$!
if [ -n "${MAIN_TREE:-}" ] && [ -d "$MAIN_TREE/src/helios" ]; then
  PYTHONPATH=$MAIN_TREE/src:$PWD/tests:/tmp/site timeout 180 python3 bench/ttft_host.py "${common[@]}" --role b \
    --label main --use-core "$scratch/core" --json "$out/ttft_host_main.json" > "$scratch/main.log" 2>&1 &
  theirs=$!
else
  echo "no MAIN_TREE: this tree alone" | tee -a "$log"
  theirs=""
fi
wait $mine
[ -n "$theirs" ] && wait $theirs
wait $tests
{ echo "=== GPU tests"; grep -v "PytestBenchmarkWarning\|warner(" "$scratch/tests.log" | tail -25
  for name in ttft3 main; do
    [ -f "$scratch/$name.log" ] || continue
    echo "=== bench/ttft_host.py ($name)"
    grep -v "checkpoint: layer\|FutureWarning\|return cls\|UserWarning\|_warn_once" "$scratch/$name.log" | tail -12
  done; } >> "$log"
python3 - "$out" >> "$log" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {name: json.loads((out / f"ttft_host_{name}.json").read_text())
        for name in ("ttft3", "main") if (out / f"ttft_host_{name}.json").exists()}
if len(runs) == 2:
    a, b = runs["ttft3"]["medians_ms"], runs["main"]["medians_ms"]
    print("=== this tree (ttft3) against main, medians of alternating cold requests")
    for key in ("ttft", "host", "admit", "schedule", "prepack", "pack", "call", "launch", "device"):
        if key in a and key in b:
            print(f"  {key:<9} ttft3 {a[key]:8.3f} ms   main {b[key]:8.3f} ms   saved {b[key] - a[key]:+7.3f} ms")
    same = runs["ttft3"]["tokens"] == runs["main"]["tokens"]
    cache = runs["ttft3"]["cache_checksum"] == runs["main"]["cache_checksum"]
    print(f"  first tokens equal: {same}; KV cache checksums equal: {cache}")
EOF
rm -rf "$scratch"
echo "=== summary ($(( SECONDS - started )) s)"
grep -E "passed|failed|error|^exit" "$log" | tail -3
sed -n '/=== bench\/ttft_host.py/,$p' "$log" | grep -E "cold TTFT|host before|saved|equal|collector|measuring alone|never got"
