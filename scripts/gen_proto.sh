#!/usr/bin/env bash
# Regenerates the committed Python code from the .proto files under proto/ (the source of truth).
# Uses the pinned grpcio-tools from the test extras so the output is byte-for-byte reproducible.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" -m grpc_tools.protoc -Iproto --python_out=src --pyi_out=src proto/helios/contract/*.proto
