"""Qwen2.5-VL on CUDA through the runtime: the prepared core's VISION programs are captured as CUDA
graphs at load, and greedy tokens over 16 steps with one and with two images, served over HTTP with
`--device cuda`, equal the CPU server's (float32); a repeated image is a feature-cache hit there too."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

from support.server_core import ServerProcess
from vision.test_vl_server import _metric, _user
from vision.vl_checkpoint import SERVED_ID, prepare_vl_core

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return prepare_vl_core(tmp_path_factory.mktemp("vl-cuda"))[1]


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
