#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 120 python3 .anchor/probe.py 2>&1 | grep -v Warning
# the probe script: bench/results/h200_session30_call4/probe.py (the same file, run before the timing change)
