#!/usr/bin/env bash
# Regenerates the committed Python code from the .proto files under proto/ (the source of truth):
# every proto/helios/contract/*.proto -> src/helios/contract/*_pb2.py and *_pb2.pyi.
# Uses the pinned grpcio-tools from the test extras so the output is byte-for-byte reproducible;
# tests/contract/test_generated_code.py regenerates into a temporary folder and compares.
#
#   scripts/gen_proto.sh            regenerate in place (commit the result)
#   scripts/gen_proto.sh OUT_DIR    write the generated tree under OUT_DIR instead
#
# After changing a .proto file, also refresh the descriptor snapshot:
#   scripts/refresh_descriptor_snapshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${1:-src}
pinned=$(sed -n 's/.*"grpcio-tools==\([0-9.]*\)".*/\1/p' pyproject.toml)
have=$("$py" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')
if [ "$have" != "$pinned" ]; then
  echo "gen_proto.sh: grpcio-tools $have is installed; the pinned version is $pinned" >&2
  exit 1
fi
mkdir -p "$out"
"$py" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" proto/helios/contract/*.proto
