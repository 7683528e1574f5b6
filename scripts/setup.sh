#!/usr/bin/env bash
# Sets up a local virtual environment (.venv) with the pinned CPU build of PyTorch and the project
# with its test extras. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# CPU torch first: a bare 'torch' requirement would otherwise pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test]"
