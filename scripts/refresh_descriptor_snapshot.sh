#!/usr/bin/env bash
# Refreshes proto/descriptor_snapshot.json from proto/helios/contract/*.proto after a compatible
# schema change (new fields, values, messages). It refuses, listing the problems, when a change
# alters what a recorded field or enum number means or removes one without `reserved` (number
# and name). tests/contract/test_descriptor_snapshot.py fails until the snapshot is refreshed.
# Without arguments it writes; pass --check to only compare.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "--check" ]; then
  exec "$py" -m helios.contract.schema_snapshot
fi
exec "$py" -m helios.contract.schema_snapshot --write
