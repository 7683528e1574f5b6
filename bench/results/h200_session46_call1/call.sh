#!/usr/bin/env bash
# next session's first call: the tree (a load at a 0.5 ms switch interval) against its parent a7f42a4 (Python's 5 ms),
# a 32-layer 8B-shaped core, fresh processes alternated, empty then warm Triton caches
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
OLD_SRC=.anchor/old45/src OUT=$out bash bench/load_ab.sh 3 > "$out/load_ab.txt" 2>&1
cat "$out/load_ab.txt"
