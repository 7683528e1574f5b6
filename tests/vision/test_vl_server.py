"""Done-when test of images end to end: the tiny random Qwen2.5-VL checkpoint prepared by `helios
prepare`, served by `helios serve`, driven by the `openai` client with data: URLs. Greedy tokens over
16 steps with one and with two images equal transformers' `generate` with its own processor on the
same image bytes (float32); bad data: URLs are 400s naming the problem; a repeated image is encoded
once (image cache hits in /metrics); equal prompt tokens with a different image share no cached pages."""

from __future__ import annotations

import base64
import io
import signal

import httpx
import openai
import pytest
import torch

from support.server_core import ServerProcess

from .tiny_vl import IMAGE_TOKEN, hf_image_processor, image_bytes
from .vl_checkpoint import SERVED_ID, shared_vl_core

PIL = pytest.importorskip("PIL.Image")
# The last one only the feature-cache test sends, so its first request misses the cache whatever
# ran before it (a module's tests can run in any order under xdist's work stealing).
IMAGES = [image_bytes(90, 60, 1), image_bytes(40, 100, 2, "JPEG"), image_bytes(64, 64, 5, "WEBP"),
          image_bytes(64, 64, 8, "WEBP")]
MEDIA = ["image/png", "image/jpeg", "image/webp", "image/webp"]
UNSEEN = 3
MAX_IMAGE_BYTES = 200_000


def _uniform_png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    PIL.new("RGB", (width, height), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def data_url(index: int) -> str:
    return f"data:{MEDIA[index]};base64," + base64.b64encode(IMAGES[index]).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    model, core = shared_vl_core(tmp_path_factory.getbasetemp(), "vl-core")
    process = ServerProcess(core, "--max-active", "4", "--max-image-bytes", str(MAX_IMAGE_BYTES),
                            "--image-cache-images", "3", log=root / "server.log")
    yield model, process, core
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _user(*images: int, text: str = "Describe.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _reference(model, prompt_ids: list[int], images: tuple[int, ...], steps: int = 16) -> list[int]:
    input_ids = torch.tensor([prompt_ids])
    extra = {}
    if images:
        processed = hf_image_processor()(images=[PIL.open(io.BytesIO(IMAGES[i])) for i in images],
                                         return_tensors="pt")
        extra = {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **extra,
                             max_new_tokens=steps, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def _expected_prompt(count_by_image: list[int], text: str) -> list[int]:
    """The prompt transformers' processor builds: the template's placeholders, one per feature."""
    from .vl_checkpoint import qwen2_tokenizer

    tok = qwen2_tokenizer()
    ids = tok.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n").ids
    for count in count_by_image:
        ids += [151652] + [IMAGE_TOKEN] * count + [151653]
    return ids + tok.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n").ids


@pytest.mark.parametrize("images", [(0,), (0, 1)], ids=["one-image", "two-images"])
def test_greedy_tokens_equal_transformers(served, client, images):
    model = served[0]
    response = client.chat.completions.create(model=SERVED_ID, messages=_user(*images), max_tokens=16,
                                              temperature=0, extra_body={"return_token_ids": True})
    prompt_ids = response.model_extra["prompt_token_ids"]
    grids = hf_image_processor()(images=[PIL.open(io.BytesIO(IMAGES[i])) for i in images])["image_grid_thw"]
    assert prompt_ids == _expected_prompt([int(g.prod()) // 4 for g in grids], "Describe.")
    expected = _reference(model, prompt_ids, images)
    assert response.choices[0].token_ids == expected
    assert len(set(expected)) > 1


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_repeated_image_hits_the_feature_cache_and_another_image_misses_the_prefix_cache(served, client):
    url = served[1].url
    hits, misses = _metric(url, "helios_image_cache_hits"), _metric(url, "helios_image_cache_misses")
    first = client.chat.completions.create(model=SERVED_ID, messages=_user(UNSEEN, text="Again?"), max_tokens=4,
                                           temperature=0, extra_body={"return_token_ids": True})
    again = client.chat.completions.create(model=SERVED_ID, messages=_user(UNSEEN, text="Again?"), max_tokens=4,
                                           temperature=0, extra_body={"return_token_ids": True})
    assert again.choices[0].token_ids == first.choices[0].token_ids
    assert _metric(url, "helios_image_cache_misses") == misses + 1  # encoded once
    assert _metric(url, "helios_image_cache_hits") >= hits + 1  # the second request reused its features
    reused = again.model_extra["reused_prompt_tokens"]
    assert reused > 0  # the same image: cached pages reused
    # Same token ids (a same-sized image) but different pixels: no cached page of the first image applies.
    other = base64.b64encode(image_bytes(64, 64, 6, "WEBP")).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/webp;base64,"
                                                                                 + other}},
                                             {"type": "text", "text": "Again?"}]}]
    different = client.chat.completions.create(model=SERVED_ID, messages=messages, max_tokens=4, temperature=0,
                                               extra_body={"return_token_ids": True})
    assert different.model_extra["prompt_token_ids"] == first.model_extra["prompt_token_ids"]
    assert different.model_extra["reused_prompt_tokens"] < first.model_extra["prompt_token_ids"].index(IMAGE_TOKEN)


@pytest.mark.parametrize("url, problem", [
    ("data:image/png;base64,@@@not-base64@@@", "not valid base64"),
    ("data:image/png,rawbytes", "base64-encoded"),
    ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), "is not image/png"),
    ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "not a PNG, JPEG, WebP or GIF"),
    ("data:image/png;base64," + base64.b64encode(IMAGES[0][: len(IMAGES[0]) // 2]).decode(), "truncated"),
    ("data:image/png;base64," + base64.b64encode(_uniform_png(5000, 4000)).decode(), "pixels"),
    ("data:image/png;base64," + base64.b64encode(image_bytes(400, 400, 3, "BMP")[:300_000]).decode(),
     f"larger than the {MAX_IMAGE_BYTES}-byte limit"),
    ("https://example.com/cat.png", "remote image URLs are not fetched"),
    ("data:image/png", "malformed data: URL"),
])
def test_bad_image_urls_are_400s_naming_the_problem(client, url, problem):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "hi"}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SERVED_ID, messages=messages, max_tokens=2)
    assert problem in str(caught.value)


def test_too_many_images_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="at most 4 images"):
        client.chat.completions.create(model=SERVED_ID, messages=_user(0, 1, 2, 0, 1), max_tokens=2)


def test_an_image_past_the_first_prefill_chunk_and_text_only_requests(served, client):
    long_text = " ".join(f"word{i}" for i in range(120))  # the prompt spans two 128-token prefill chunks
    messages = [{"role": "user", "content": [{"type": "text", "text": long_text},
                                             {"type": "image_url", "image_url": {"url": data_url(1)}},
                                             {"type": "text", "text": "And this?"}]}]
    response = client.chat.completions.create(model=SERVED_ID, messages=messages, max_tokens=16, temperature=0,
                                              extra_body={"return_token_ids": True})
    prompt_ids = response.model_extra["prompt_token_ids"]
    assert len(prompt_ids) > 128 and prompt_ids.index(IMAGE_TOKEN) > 128
    assert response.choices[0].token_ids == _reference(served[0], prompt_ids, (1,))
    text_only = client.chat.completions.create(model=SERVED_ID, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    ids = text_only.model_extra["prompt_token_ids"]
    assert text_only.choices[0].token_ids == _reference(served[0], ids, (), steps=8)


def test_the_feature_cache_is_allocated_at_load_from_the_flag(served):
    from helios.core.reader import open_core
    from helios.runtime.records.capacities import Operation
    from helios.runtime.execution.vision_programs import image_feeder
    from helios.runtime.execution.geometry import program_variant
    from helios.runtime.loading.model import LoadOptions, load_model

    core = served[2]
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    model = load_model(opened, LoadOptions(image_cache_images=3))
    vision = model.prepared.contract.model.vision
    rows = max(vision.patch_capacities) // vision.patches_per_feature
    assert model.image_cache.slab.shape == (3 * rows, served[0].config.text_config.hidden_size)
    assert model.image_cache.slab.dtype == torch.float32 and model.image_cache.num_images == 3
    assert image_feeder(model, None).cache is model.image_cache
    # its DECODE programs only read the mrope deltas prompt programs store: they admit no slot
    variants = [program_variant(p, model.prepared) for p in model.programs]
    assert {v.admits_slots for v in variants if v.operation == Operation.DECODE} == {False}
    assert all(v.admits_slots for v in variants if v.operation != Operation.DECODE)


def test_choices_share_an_image_prompt_with_the_first_ones_positions(served, client):
    """n choices of an image prompt: the later ones admit onto the first one's pages with one prompt
    token left, in a prompt program (it stores the slot's mrope delta; the slots were last used with
    other images, hence other deltas), so every choice gets the same log-probabilities."""
    client.chat.completions.create(model=SERVED_ID, messages=_user(0, 1, text="Tell"), max_tokens=4, temperature=0,
                                   n=4)
    response = client.chat.completions.create(model=SERVED_ID, messages=_user(2, text="Tell me"), max_tokens=6,
                                              temperature=0, n=3, logprobs=True)
    rows = [[t.logprob for t in choice.logprobs.content] for choice in response.choices]
    for row in rows[1:]:
        assert row == pytest.approx(rows[0], abs=1e-6)


@pytest.mark.parametrize("prompt, param", [("hello <|image_pad|> world", "prompt"),
                                           ([9707, IMAGE_TOKEN, 1879], "prompt"),
                                           (["fine", "<|vision_start|><|image_pad|><|vision_end|>"], "prompt[1]")])
def test_a_completion_prompt_holding_the_image_placeholder_is_a_400(client, prompt, param):
    """/v1/completions takes no images: the placeholder's text or id would be a feature slot with
    no image behind it (it was served, 200)."""
    with pytest.raises(openai.BadRequestError, match="image placeholder") as caught:
        client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=2)
    assert caught.value.body["param"] == param
    text = client.completions.create(model=SERVED_ID, prompt="hello <|vision_start|> world", max_tokens=2)
    assert text.choices[0].finish_reason == "length"
