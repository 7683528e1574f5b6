#!/usr/bin/env bash
# session 22 call 2: HTTP against in-process at 1/64/256 streams on main (issue 19's GPU target), then the
# decode cohort's host A/B on the GPU (issue 18, 256 rows)
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site PYTHONUNBUFFERED=1
OUT="$out/logs/serve64" timeout 480 bash bench/serve64_session.sh
echo "== serve64 done at ${SECONDS}s"
left=$((560 - SECONDS))
if [ $left -gt 60 ]; then
  OUT="$out/logs/cohort" BUDGET=$left timeout $left bash bench/cohort_session.sh
fi
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
