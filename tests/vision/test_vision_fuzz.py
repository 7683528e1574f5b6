"""Seeded differential fuzzing of image requests: the tiny Qwen2.5-VL core served in this process
(over ASGI) on a small page pool and a two-image feature cache, against transformers (float32) on
the same weights and the same image bytes through its own processor.

Each batch of concurrent chat requests mixes text-only and image requests: 0 to 3 images of varied
sizes (1x1, non-square, sides that are not multiples of the patch or merge size, past max_pixels),
modes (RGB, RGBA, grayscale with and without alpha, palette with transparency, 16-bit, 1-bit, CMYK)
and formats (PNG, JPEG, WebP, GIF; BMP and over-wide images are 400s naming their part),
in any message position (before or after text, several user turns with assistant turns between),
the same image repeated in one request and across requests, `n` > 1 choices, and streams the client
abandons after the first chunk. A twin of an earlier request has the same text and the same
placeholder counts but other pixels in one image.

Checked per response: the prompt token ids equal the chat template's rendering with each image's
placeholder expanded as the transformers processor expands it, `usage` counts them, every choice's
tokens are transformers' greedy tokens (teacher-forced: at each step Helios's token has the largest
logit, to 1e-3), their log-probabilities where asked (Qwen2.5-VL, whose core has token-logprobs
programs) are transformers' log-softmax, and a `stop` finish is transformers' end-of-sequence token; a request reuses at most
the cached prefix it shares with an earlier or concurrent request, where an image's feature tokens
match only the same image bytes (so a twin shares no page past the image that differs). Afterwards:
the server is healthy, no request holds pages, every page is free or cached, a batch that
outgrows the page pool preempted a request, and repeated images hit the feature cache.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import threading
from dataclasses import dataclass, field

import httpx
import jinja2
import numpy as np
import pytest
import torch

from helios.frontend.images.decode import ImageLimits
from helios.server.app import create_app
from support.sweeps import swept

from .test_vl3_server import VL3_OPTIONS
from .tiny_vl import IMAGE_TOKEN, hf_image_processor, tiny_model
from .tiny_vl3 import hf_image_processor3, tiny_model3
from .vl_checkpoint import SERVED_ID, TEMPLATE, qwen2_tokenizer, shared_vl_core

PIL = pytest.importorskip("PIL.Image")
NUM_PAGES = 32  # the least a 512-token context takes (16 tokens a page): four long requests outgrow it
EOS = 151645
UNIT = 4  # patches per feature (merge 2 x 2)
GREEDY_TOLERANCE = 1e-3
SIZES = [(1, 1), (2, 3), (27, 29), (28, 28), (57, 30), (100, 7), (7, 100), (90, 60), (200, 150), (333, 111),
         (640, 480), (29, 300), (150, 40), (64, 64), (140, 112), (1, 150), (300, 1), (1, 250)]
KINDS = [("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "L"), ("PNG", "LA"), ("PNG", "P"), ("PNG", "P-transparent"),
         ("PNG", "I;16"), ("PNG", "1"), ("JPEG", "RGB"), ("JPEG", "L"), ("JPEG", "CMYK"), ("WEBP", "RGB"),
         ("WEBP", "RGBA"), ("GIF", "P"), ("GIF", "P-transparent"), ("BMP", "RGB")]
WORDS = "the a cat dog red blue image picture describe what is this and then tell me more about it".split()


@dataclass(frozen=True)
class Image:
    data: bytes
    media: str
    size: tuple[int, int]
    kind: tuple[str, str]

    @property
    def url(self) -> str:
        return f"data:{self.media};base64," + base64.b64encode(self.data).decode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Case:
    """One request: its body, the template's view of its messages, its images in prompt order and
    where each image part is."""

    body: dict
    template_messages: list[dict]
    images: list[Image]
    places: list[str]
    response: dict | None = None
    keyed: list | None = field(default=None, repr=False)  # prompt ids, feature tokens as image digests


@dataclass(frozen=True)
class Family:
    core: str  # the shared core's name (`shared_vl_core`)
    model: object  # builds the seeded transformers model
    processor: object  # builds transformers' image processor
    options: dict
    batches: int  # random batches before the one that outgrows the page pool
    seed: int
    logprobs: bool  # the core has token-logprobs programs: some requests ask for log-probabilities


# One random batch before the preemption batch by default (its requests, repeat and twins meet the feature
# cache, the prefix cache and each other concurrently, the preemption batch's meet them later); a second
# one, more random requests on the same paths, with HELIOS_VISION_FUZZ_SWEEP=1.
QWEN2_5_BATCHES = 2 if swept("HELIOS_VISION_FUZZ_SWEEP") else 1
FAMILIES = {"qwen2.5-vl": Family("vl-core", tiny_model, hf_image_processor, {}, QWEN2_5_BATCHES, 20261205, True)}
# Qwen3-VL's fuzz runs with HELIOS_VISION_FUZZ_SWEEP=1: Qwen2.5-VL's takes the same serving path (image
# cache, feature reuse, preemption) by default, and test_vl3_server checks Qwen3-VL's tokens against
# transformers with one and two images and its repeated image encoded once.
if swept("HELIOS_VISION_FUZZ_SWEEP"):
    # its own core: test_vl3_server's captures no mixed program, which the concurrent requests here run
    FAMILIES["qwen3-vl"] = Family("vl3-fuzz-core", tiny_model3, hf_image_processor3, {**VL3_OPTIONS, "mixed": True},
                                  1, 20261206, False)


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory):
    from helios.core.reader import open_core
    from helios.runtime.loading.model import LoadOptions
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel

    family = FAMILIES[request.param]
    model, core = shared_vl_core(tmp_path_factory.getbasetemp(), family.core, family.model, **family.options)
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    load = LoadOptions(num_pages=NUM_PAGES, image_cache_images=2)
    runtime = build_runtime(opened, RuntimeOptions(load=load, queue_capacity=16))
    served = ServedModel.from_runtime(runtime, queue_capacity=16, frontend_workers=2,
                                      image_limits=ImageLimits(max_images=4, max_bytes=1 << 20))
    served.start()
    try:
        yield family, model, served
    finally:
        served.shutdown()


# --- requests ------------------------------------------------------------------------------------


def make_image(rng: random.Random, size=None, kind=None) -> Image:
    width, height = size or rng.choice(SIZES)
    fmt, mode = kind or rng.choice(KINDS)
    colours = np.random.default_rng(rng.randrange(1 << 30)).integers(
        0, 255, size=(max(1, height // 8), max(1, width // 8), 4), dtype=np.uint8)
    base = PIL.fromarray(colours, "RGBA").resize((width, height), PIL.Resampling.BILINEAR)
    if mode in ("RGBA", "LA"):
        image = base.convert(mode)
    elif mode == "P-transparent":
        image = base.convert("RGB").convert("P", palette=PIL.Palette.ADAPTIVE, colors=16)
        image.info["transparency"] = 3
    elif mode == "I;16":
        image = base.convert("L").convert("I;16")
    else:
        image = base.convert("RGB").convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt, **({"transparency": 3} if "transparency" in image.info else {}))
    media = {"PNG": "image/png", "JPEG": rng.choice(["image/jpeg", "image/jpg"]), "WEBP": "image/webp",
             "GIF": "image/gif", "BMP": rng.choice(["image/bmp", "image/png"])}[fmt]
    return Image(out.getvalue(), media, (width, height), (fmt, mode))


def words(rng: random.Random) -> str:
    count = rng.choice([rng.randint(1, 12), rng.randint(20, 70)])
    return " ".join(rng.choice(WORDS) for _ in range(count))


def make_case(rng: random.Random, seen: list[Image]) -> Case:
    turns = rng.randint(1, 3)
    num_images = rng.choice([0, 0, 1, 1, 2, 3])
    image_turns = sorted(rng.randrange(turns) for _ in range(num_images))
    messages, template, images, places = [], [], [], []
    if rng.random() < 0.3:
        system = words(rng)
        messages.append({"role": "system", "content": system})
        template.append({"role": "system", "content": system})
    for turn in range(turns):
        parts = []
        for _ in range(image_turns.count(turn)):
            image = rng.choice(seen) if seen and rng.random() < 0.4 else make_image(rng)
            seen.append(image)
            parts.append(image)
        for _ in range(rng.randint(0 if parts else 1, 2)):
            parts.insert(rng.randint(0, len(parts)), words(rng))
        images += [p for p in parts if isinstance(p, Image)]
        places += [f"messages[{len(messages)}].content[{j}]" for j, p in enumerate(parts) if isinstance(p, Image)]
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": p.url}} if isinstance(p, Image) else {"type": "text", "text": p}
            for p in parts]})
        # the template renders the parts itself, text parts alone too (as transformers passes them)
        content = [{"type": "image"} if isinstance(p, Image) else {"type": "text", "text": p} for p in parts]
        template.append({"role": "user", "content": content})
        if turn < turns - 1:
            reply = words(rng)
            messages.append({"role": "assistant", "content": reply})
            template.append({"role": "assistant", "content": reply})
    body = {"model": SERVED_ID, "messages": messages, "temperature": 0, "return_token_ids": True,
            "max_tokens": rng.choice([rng.randint(1, 8), rng.randint(20, 40)]), "n": rng.choice([1, 1, 2, 3])}
    return Case(body, template, images, places)


def twin_of(family: Family, rng: random.Random, case: Case) -> Case | None:
    """`case` with its last acceptable image replaced by other pixels of the same size, mode and
    format: the same prompt token ids, another image."""
    usable = [i for i, image in enumerate(case.images) if expected_error(family, [image], ["x"]) is None]
    if not usable:
        return None
    index = usable[-1]
    old = case.images[index]
    new = make_image(rng, old.size, old.kind)
    twin = json.loads(json.dumps(case.body).replace(old.url, new.url))
    images = [new if image is old else image for image in case.images]
    return Case(twin, case.template_messages, images, case.places)


# --- expectations --------------------------------------------------------------------------------


def expected_error(family: Family, images: list[Image], places: list[str]) -> tuple[str, str] | None:
    """(message part, param) of the 400 a request's images get, None when they are served: images
    are decoded and prepared in prompt order (a BMP or an aspect ratio past 200 fails there), then
    each fits the default patch capacity, which holds every image the processor produces (a thin
    image scaled up past max_pixels too: 252 patches, not max_pixels' 80). More than four images
    are refused first, for the request as a whole."""
    if len(images) > 4:
        return f"at most 4 images; it has {len(images)}", "messages"
    for image, place in zip(images, places):
        if image.kind[0] == "BMP":
            return ("is not image/png" if image.media == "image/bmp" else "is a BMP image"), place
        if max(image.size) / min(image.size) > 200:
            return "exceeds 200", place
    return None


def expected_prompt(case: Case, grids) -> list[int]:
    rendered = jinja2.Template(TEMPLATE.read_text()).render(messages=case.template_messages,
                                                           add_generation_prompt=True)
    ids = qwen2_tokenizer().encode(rendered, add_special_tokens=False).ids
    out, counts = [], iter(int(np.prod(g)) // UNIT for g in grids)
    for token in ids:
        out += [token] * (next(counts) if token == IMAGE_TOKEN else 1)
    return out


def keyed_prompt(prompt: list[int], case: Case, grids) -> list:
    """The prompt as the prefix cache should see it: each feature token is its image's digest."""
    keyed, images = list(prompt), iter(zip(case.images, grids))
    index = 0
    while index < len(keyed):
        if keyed[index] == IMAGE_TOKEN:
            image, grid = next(images)
            count = int(np.prod(grid)) // UNIT
            keyed[index:index + count] = [image.digest] * count
            index += count
        else:
            index += 1
    return keyed


def common_prefix(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_response(family: Family, model, case: Case, status: int, body: dict) -> None:
    error = expected_error(family, case.images, case.places)
    if error is not None:
        assert status == 400, (case.places, body)
        assert error[0] in body["error"]["message"] and body["error"]["param"] == error[1], body
        return
    assert status == 200, body
    extra, grids = {}, []
    if case.images:
        processed = family.processor()(images=[PIL.open(io.BytesIO(i.data)) for i in case.images],
                                         return_tensors="pt")
        grids = processed["image_grid_thw"].tolist()
        extra = {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}
    prompt = body["prompt_token_ids"]
    assert prompt == expected_prompt(case, grids)
    outputs = [choice["token_ids"] for choice in body["choices"]]
    assert len(outputs) == case.body["n"]
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["completion_tokens"] == sum(len(tokens) for tokens in outputs)
    case.response, case.keyed = body, keyed_prompt(prompt, case, grids)
    for choice, tokens in zip(body["choices"], outputs):
        ids = torch.tensor([prompt + tokens])
        if case.images:
            extra["mm_token_type_ids"] = (ids == IMAGE_TOKEN).int()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits[0, len(prompt) - 1:]
        chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.int64)]
        gaps = logits[:len(tokens)].max(-1).values - chosen
        assert (gaps <= GREEDY_TOLERANCE).all(), (choice["index"], tokens, logits.argmax(-1).tolist())
        if case.body.get("logprobs"):  # the log-softmax of the logits at each step
            reported = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
            expected = torch.log_softmax(logits[:len(tokens)], -1)[torch.arange(len(tokens)), tokens]
            torch.testing.assert_close(reported, expected, atol=1e-3, rtol=0)
        if choice["finish_reason"] == "stop":
            assert int(logits[len(tokens)].argmax()) == EOS
        else:
            assert choice["finish_reason"] == "length" and len(tokens) == case.body["max_tokens"]


def check_reuse(case: Case, others: list[Case]) -> None:
    """A request reuses no more of its prompt than it shares, image bytes included, with another
    request that was sent before it or beside it (its own other choices and abandoned copy included)."""
    if case.keyed is None:
        return
    shared = max([common_prefix(case.keyed, other.keyed) for other in others if other.keyed is not None]
                 + [len(case.keyed) if case.body["n"] > 1 or case in others else 0])
    assert case.response["reused_prompt_tokens"] <= shared, (case.response["reused_prompt_tokens"], shared)


# --- the run -------------------------------------------------------------------------------------


class HeldWorker:
    """Holds the model worker at its next round until `expected` requests were submitted, so a
    batch reaches the scheduler together."""

    def __init__(self, engine):
        self._engine, self._submitted, self._expected = engine, 0, 0
        self._condition = threading.Condition()
        step, submit = engine.step, engine.submit

        def held_step():
            with self._condition:
                self._condition.wait_for(lambda: self._submitted >= self._expected, timeout=60)
            step()

        def counted_submit(request):
            submit(request)
            with self._condition:
                self._submitted += 1
                self._condition.notify_all()

        engine.step, engine.submit = held_step, counted_submit

    def expect(self, count: int) -> None:
        with self._condition:
            self._expected = self._submitted + count

    def release(self) -> None:
        del self._engine.step, self._engine.submit


async def abandon(client: httpx.AsyncClient, body: dict) -> None:
    """Streams `body` and disconnects after the first chunk."""
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True, "max_tokens": 40}) as r:
        async for _ in r.aiter_lines():
            break


async def run_batch(app, cases: list[Case], abandoned: list[Case]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
        calls = [client.post("/v1/chat/completions", json=case.body) for case in cases]
        calls += [abandon(client, case.body) for case in abandoned]
        return (await asyncio.gather(*calls))[:len(cases)]


def long_image_case(rng: random.Random, seen: list[Image]) -> Case:
    """About 120 prompt tokens around one or two images, 40 output tokens: four of them outgrow the
    page pool while they decode."""
    case = make_case(random.Random(rng.randrange(1 << 30)), [])
    image = make_image(rng, (200, 150), ("PNG", "RGB"))
    seen.append(image)
    text = " ".join(rng.choice(WORDS) for _ in range(60))
    case.body["messages"] = [{"role": "user", "content": [{"type": "text", "text": text},
                                                          {"type": "image_url", "image_url": {"url": image.url}}]}]
    case.template_messages = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]}]
    case.images, case.places = [image], ["messages[0].content[1]"]
    case.body.update(max_tokens=40, n=1)
    return case


def repeat_case(family: Family, rng: random.Random, seen: list[Image]) -> Case:
    """A question about one image, asked again about the same image (same bytes) after an
    assistant turn, with an image seen before in between."""
    image, earlier = make_image(rng, rng.choice(SIZES[:14]), ("PNG", "RGB")), rng.choice(seen or [None])
    between = [earlier] if earlier is not None and expected_error(family, [earlier], ["x"]) is None else []
    seen.append(image)
    question = words(rng)
    parts = [[image, question], ["and", *between, image]]
    case = make_case(random.Random(rng.randrange(1 << 30)), [])
    case.body.update(messages=[], max_tokens=rng.randint(1, 12), n=rng.choice([1, 2]))
    case.template_messages, case.images, case.places = [], [], []
    for number, turn in enumerate(parts):
        if number:
            case.body["messages"].append({"role": "assistant", "content": "It is " + question})
            case.template_messages.append({"role": "assistant", "content": "It is " + question})
        where = len(case.body["messages"])
        case.body["messages"].append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": p.url}} if isinstance(p, Image) else {"type": "text", "text": p}
            for p in turn]})
        case.template_messages.append({"role": "user", "content": [
            {"type": "image"} if isinstance(p, Image) else {"type": "text", "text": p} for p in turn]})
        case.images += [p for p in turn if isinstance(p, Image)]
        case.places += [f"messages[{where}].content[{j}]" for j, p in enumerate(turn) if isinstance(p, Image)]
    return case


def test_random_image_requests_equal_transformers(served):
    family, model, server = served
    app = create_app(server)
    engine = server.runtime.engine
    rng = random.Random(family.seed)
    seen: list[Image] = []
    sent: list[Case] = []
    loop = asyncio.new_event_loop()
    try:
        for batch_number in range(family.batches + 1):
            if batch_number == family.batches:  # the preemption batch, held until all four are submitted
                cases = [long_image_case(rng, seen) for _ in range(4)]
            else:
                cases = [make_case(rng, seen) for _ in range(4)] + [repeat_case(family, rng, seen)]
                for case in cases:
                    case.body["logprobs"] = family.logprobs and rng.random() < 0.3
                with_images = [c for c in sent + cases if c.images]
                twins = (twin_of(family, rng, c) for c in rng.sample(with_images, k=min(3, len(with_images))))
                cases += [twin for twin in twins if twin is not None][:2]
            abandoned = rng.sample(cases, k=rng.randint(0, 2)) if batch_number < family.batches else []
            preemptions = engine.scheduler.counters().preemptions
            held = HeldWorker(engine) if batch_number == family.batches else None
            if held is not None:
                held.expect(len(cases))
            try:
                responses = loop.run_until_complete(run_batch(app, cases, abandoned))
            finally:
                if held is not None:
                    held.release()
            for case, response in zip(cases, responses):
                check_response(family, model, case, response.status_code, response.json())
            for case in cases:
                check_reuse(case, [other for other in sent + cases if other is not case] + abandoned)
            sent += cases + abandoned
        assert engine.scheduler.counters().preemptions > preemptions  # the last batch outgrew the pool
    finally:
        loop.close()
    assert server.is_healthy
    counters = engine.scheduler.counters()
    assert (counters.num_running, counters.num_waiting) == (0, 0)
    assert counters.pages_free + counters.pages_cached == counters.pages_total == NUM_PAGES
    assert server.runtime.model.image_cache.stats.hits > 0
    served_images = {image.digest for case in sent if case.keyed is not None for image in case.images}
    assert server.runtime.model.image_cache.stats.misses >= len(served_images)
