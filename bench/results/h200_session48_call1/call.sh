#!/usr/bin/env bash
# session 46 call 6: 8 compile workers (the default, A) against 14 (B) on a machine's first load of the
# 32-layer 8B-shaped core (empty Triton caches only), fresh processes alternated; the dry run is now short
# enough (2.6-4.1 s, call 1) that the capture waits for the workers
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
OLD_SRC=src A_ARGS='--compile-workers 8' B_ARGS='--compile-workers 14' WARM_ROUNDS=0 OUT=$out bash bench/load_ab.sh 3 > "$out/load_ab.txt" 2>&1
cat "$out/load_ab.txt"
mkdir -p "$out/l" && tar -xzf "$out/load_ab_logs.tgz" -C "$out/l" && for f in "$out"/l/logs/*_*.log; do
  echo "$(basename $f): $(grep -m1 -E '^load \(logprobs\): [0-9]' $f) weights $(grep -oE 'weights \(decode, verify, copy\) +[0-9.]+' $f | grep -oE '[0-9.]+$') dry $(grep -oE 'dry run on stand-ins +[0-9.]+' $f | grep -oE '[0-9.]+$') wait $(grep -oE 'waiting for workers +[0-9.]+' $f | grep -oE '[0-9.]+$') | $(grep -oE '[0-9]+ variants compiled by [0-9]+ workers \([0-9.]+ s of compiling\)' $f) | $(grep -oE 'the last done [0-9.]+ s after the first sent' $f)"
done; rm -rf "$out/l"
echo "== done at ${SECONDS}s"
