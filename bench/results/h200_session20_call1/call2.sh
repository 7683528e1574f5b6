#!/usr/bin/env bash
# session 20 call 2: the branches' device scripts, each in its own tree (main's tree + the branch's changed files), one after another
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
root=$PWD
export ANCHOR=$root/.anchor/compiled_anchor.py MAIN_TREE=$root/.anchor/trees/main
for n in ${BRANCHES:-dhost3 dkern3 ttft3}; do
  rm -rf /tmp/trees/$n; mkdir -p /tmp/trees/$n; cp -r .anchor/trees/main/. /tmp/trees/$n/
  tar -xf .anchor/delta/$n.tar -C /tmp/trees/$n; (cd /tmp/trees/$n && xargs -r rm -f < $root/.anchor/delta/$n.deleted)
  mkdir -p "$out/logs/$n"
  echo "== $n start at ${SECONDS}s"
  (cd /tmp/trees/$n && OUT="$out/logs/$n" timeout ${PER:-190} bash bench/${n}_session.sh > "$out/logs/$n/session.out" 2>&1; echo "rc=$?" >> "$out/logs/$n/session.out")
  tail -25 "$out/logs/$n/session.out"
done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo "== done at ${SECONDS}s"
