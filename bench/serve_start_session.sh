#!/usr/bin/env bash
# `helios serve`'s start on CUDA with an 8B-shaped core, in one device call (one H200 or H100, about
# 5 minutes), logs under $OUT:
#   1. bench/cold_start.py: the core prepared and loaded in-process, phase by phase (kept in /tmp/core8b);
#   2. bench/serve_ready.py: launch to the first /health 200 of `helios serve --device cuda` on that core,
#      for the tree before a change (.anchor/old.patch applied, when present) and the tree, alternating,
#      ROUNDS starts each after one warm-up;
#   3. bench/standin_referrers.py at the same layers (stand-in weights alive after the load), if STANDIN=1;
#   4. pytest on TESTS (paths under tests/, with the same src), if set.
# Each tree is started once uncounted first; FRESH=1 gives every start its own empty Triton and Inductor
# caches (a machine's first start, bench/serve_ready.py --fresh-caches); TRACE=1 (the default) prints each tree's median start step by
# step (HELIOS_START_TRACE, bench/serve_ready.py --trace).
# The tree's src is this checkout's, or .anchor/src.tgz where present (`git archive --format=tar.gz HEAD src`:
# a commit's, whatever the working tree holds); the patch: `git diff HEAD REV -- src > .anchor/old.patch`.
# Run from the repository root with
# `.anchor` and `.whl` carried:  bash bench/serve_start_session.sh     (LAYERS=4 for a quick run)
set -uo pipefail
out=${OUT:-device-out}
layers=${LAYERS:-32}
mkdir -p "$out"
source bench/device_env.sh  # the wheels, `src` and PYTHONPATH
export PYTHONPATH=$PWD/bench:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$out/gpu.txt"
trees=(--tree "$src")
if [ -f .anchor/old.patch ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -r "$src" /tmp/old/ && (cd /tmp/old && patch -s -p1 < "$OLDPWD/.anchor/old.patch") || exit 1
  trees=(--tree /tmp/old/src --tree "$src")
fi
rm -rf /tmp/core8b
timeout 240 python3 bench/cold_start.py --layers "$layers" --variants logprobs --skip-no-logprobs-load \
  --keep-core /tmp/core8b 2>&1 | grep -v "checkpoint: layer" | tee "$out/cold_start.log" | tail -45
flags=()
[ "${TRACE:-1}" = 1 ] && flags=(--trace)
[ "${FRESH:-0}" = 1 ] && flags+=(--fresh-caches)
timeout 330 python3 bench/serve_ready.py "${trees[@]}" "${flags[@]}" --rounds "${ROUNDS:-3}" --timeout 120 -- \
  /tmp/core8b/model.core --device cuda --accept bench/gpu --trust /tmp/core8b/publisher.key.pub 2>&1 \
  | tee "$out/serve_ready.log"
if [ "${STANDIN:-0}" = 1 ]; then
  timeout 200 python3 bench/standin_referrers.py --layers "$layers" 2>&1 | tail -40 | tee "$out/standin.log"
fi
if [ -n "${TESTS:-}" ]; then
  PYTHONPATH=$PWD/tests:$PYTHONPATH timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -ra $TESTS 2>&1 \
    | tail -30 | tee "$out/tests.log"
fi
