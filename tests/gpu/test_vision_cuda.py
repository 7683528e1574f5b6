"""Qwen2.5-VL and Qwen3-VL on CUDA through the runtime: the prepared core's VISION programs are captured as CUDA
graphs at load, and greedy tokens over 16 steps with one and with two images, served over HTTP with
`--device cuda`, equal the CPU server's (float32); a repeated image is a feature-cache hit there too;
feeding image features (encoding a new image, reusing a cached one) allocates no device memory."""

from __future__ import annotations

import asyncio
import signal

import httpx
import openai
import pytest

from support.server_core import ServerProcess
from vision.test_vl3_server import prepare_vl3_core
from vision.test_vl_server import _metric, _user
from vision.vl_checkpoint import SERVED_ID, prepare_vl_core

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def core(request, tmp_path_factory):
    prepare = prepare_vl_core if request.param == "qwen2_5_vl" else prepare_vl3_core
    return prepare(tmp_path_factory.mktemp(f"{request.param}-cuda"))[1]


def test_vision_programs_are_captured_as_cuda_graphs(core):
    from helios.core.reader import open_core
    from helios.runtime.loading.model import LoadOptions, load_model

    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    model = load_model(opened, LoadOptions(device="cuda", cuda_graphs=True))
    assert model.vision_programs and all(hasattr(p.module, "replay") for p in model.vision_programs)


def _tokens(process) -> list[list[int]]:
    client = openai.OpenAI(base_url=process.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    out = []
    for images in ((0,), (0, 1), (0,)):
        response = client.chat.completions.create(model=SERVED_ID, messages=_user(*images), max_tokens=16,
                                                  temperature=0, extra_body={"return_token_ids": True})
        out.append(response.choices[0].token_ids)
    return out


def test_cuda_server_tokens_equal_the_cpu_server(core, tmp_path):
    results = {}
    for device in ("cpu", "cuda"):
        process = ServerProcess(core, "--device", device, log=tmp_path / f"{device}.log")
        try:
            results[device] = _tokens(process)
            if device == "cuda":
                assert _metric(process.url, "helios_image_cache_hits") >= 2  # image 0 again, twice
                assert _metric(process.url, "helios_image_cache_misses") == 2
                assert httpx.get(process.url + "/health").status_code == 200
        finally:
            code, log = process.terminate()
        assert code == -signal.SIGTERM and "Traceback" not in log, log
    assert results["cuda"] == results["cpu"]
    assert len(set(results["cpu"][0])) > 1


def test_feeding_image_features_allocates_no_device_memory(core):
    """In-process CUDA runtime behind the ASGI app: every feed (misses and hits) leaves the CUDA
    caching allocator's allocation count unchanged, and the feature cache's slab stays in place."""
    import torch

    from helios.core.reader import open_core
    from helios.runtime.loading.model import LoadOptions
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.app import create_app
    from helios.server.service import ServedModel

    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, RuntimeOptions(load=LoadOptions(device="cuda", image_cache_images=2)))
    feeder, device = runtime.engine.executor.images, runtime.model.device
    slab = feeder.cache.slab.data_ptr()
    deltas = []
    feed = feeder.feed

    def counted(rows, images):
        before = torch.cuda.memory_stats(device)["allocation.all.allocated"]
        feed(rows, images)
        deltas.append(torch.cuda.memory_stats(device)["allocation.all.allocated"] - before)

    feeder.feed = counted
    served = ServedModel.from_runtime(runtime, queue_capacity=8, frontend_workers=2)
    served.start()
    try:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)), base_url="http://test")
        client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)
        with asyncio.Runner() as runner:
            for images in ((0,), (0, 1), (1, 2), (0,)):  # misses, hits and evictions (two slots)
                runner.run(client.chat.completions.create(model=SERVED_ID, messages=_user(*images), max_tokens=4,
                                                          temperature=0))
    finally:
        served.shutdown()
    assert len(deltas) >= 4 and deltas == [0] * len(deltas)
    stats = feeder.cache.stats
    assert stats.hits >= 2 and stats.evictions >= 1 and feeder.cache.slab.data_ptr() == slab
