"""Qwen3-VL served through the same generic runtime: the tiny random checkpoint prepared by `helios
prepare`, served by `helios serve`, driven by the `openai` client with data: URLs; greedy tokens over
16 steps with one and with two images equal transformers' `generate` (float32), and a repeated image
is encoded once."""

from __future__ import annotations

import io
import signal

import openai
import pytest
import torch

from support.server_core import ServerProcess

from .test_vl_server import IMAGES, UNSEEN, _metric, _user
from .tiny_vl3 import MAX_PIXELS, MEAN, MIN_PIXELS, PATCH, STD, hf_image_processor3, tiny_model3
from .vl_checkpoint import SERVED_ID, ProcessorConfig, prepare_vl_core, shared_vl_core

PIL = pytest.importorskip("PIL.Image")
PROCESSOR = ProcessorConfig(PATCH, MIN_PIXELS, MAX_PIXELS, MEAN, STD)


# No token-logprobs programs: no Qwen3-VL test asks for log-probabilities (test_vl_server does, on
# Qwen2.5-VL); one decode batch (4) and no mixed prefill+decode program: the requests here come one at a
# time, so no step mixes a prompt with decoding rows (the mixed program runs the prefill program's decoder
# over more rows; Qwen2.5-VL's runs in test_vision_fuzz, whose Qwen3-VL sweep family captures it too).
VL3_OPTIONS = dict(processor=PROCESSOR, logprobs=False, decode_batches="4", mixed=False)


def prepare_vl3_core(root):
    return prepare_vl_core(root, tiny_model3(), **{**VL3_OPTIONS, "mixed": True})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl3")
    model, core = shared_vl_core(tmp_path_factory.getbasetemp(), "vl3-core", tiny_model3, **VL3_OPTIONS)
    # the engine in the serving process: test_vl_server serves images through the default engine process's pipe
    # (the same records for Qwen3-VL's images), and this one then pays one process's imports and load, not two
    process = ServerProcess(core, "--max-active", "4", "--no-engine-process", log=root / "server.log")
    yield model, process, core
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0, timeout=120)


def reference3(model, prompt_ids: list[int], images: tuple[int, ...], steps: int = 16) -> list[int]:
    input_ids = torch.tensor([prompt_ids])
    processed = hf_image_processor3()(images=[PIL.open(io.BytesIO(IMAGES[i])) for i in images], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             pixel_values=processed["pixel_values"], image_grid_thw=processed["image_grid_thw"],
                             max_new_tokens=steps, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("images", [(0,), (0, 1)], ids=["one-image", "two-images"])
def test_greedy_tokens_equal_transformers(served, client, images):
    response = client.chat.completions.create(model=SERVED_ID, messages=_user(*images), max_tokens=16,
                                              temperature=0, extra_body={"return_token_ids": True})
    prompt_ids = response.model_extra["prompt_token_ids"]
    grids = hf_image_processor3()(images=[PIL.open(io.BytesIO(IMAGES[i])) for i in images])["image_grid_thw"]
    assert prompt_ids.count(151655) == sum(int(g.prod()) // 4 for g in grids)
    expected = reference3(served[0], prompt_ids, images)
    assert response.choices[0].token_ids == expected
    assert len(set(expected)) > 1


def test_a_repeated_image_is_encoded_once(served, client):
    url = served[1].url
    misses = _metric(url, "helios_image_cache_misses")
    for _ in range(2):
        client.chat.completions.create(model=SERVED_ID, messages=_user(UNSEEN, text="Again?"), max_tokens=2,
                                       temperature=0)
    assert _metric(url, "helios_image_cache_misses") == misses + 1
