"""The example contract prepared into a core (`helios contract example-core`'s generator on
examples/contract-tiny.json) served by `helios serve`: completions and chat generate the plain
reference's greedy tokens through the speculative programs, `prompt_logprobs` come from its scored
prefill program and equal the reference, and an image request is laid out as the contract's
FEATURE_SPAN (one span of feature placeholders between the atomic spans), encoded by the VISION
program once and reused from the image cache the second time (/metrics); a regex response format is
enforced through the programs' grammar masks."""

from __future__ import annotations

import base64
import io
import re
import signal

import httpx
import pytest

from helios.core.reader import open_core
from helios.ignition.contract_core import reference_model
from helios.runtime.loading.model import LoadOptions, load_model
from support.example_core import example_core
from support.server_core import ServerProcess

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    core = example_core(tmp_path_factory.getbasetemp())
    model = load_model(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]), LoadOptions())
    reference = reference_model(dict(model.weights))
    eos = frozenset(model.prepared.contract.defaults.eos_token_ids)
    layout = model.prepared.contract.model.frontend.image_layout_data
    process = ServerProcess(core, log=tmp_path_factory.mktemp("example-serve") / "server.log")
    yield process, core, reference, eos, layout
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log


def _post(served, path: str, body: dict) -> dict:
    process, core = served[0], served[1]
    response = httpx.post(process.url + path, json={"model": core.served_id, "temperature": 0, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _metric(served, name: str) -> float:
    text = httpx.get(served[0].url + "/metrics", timeout=30).text
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def test_completions_generate_the_reference_tokens_through_speculative_programs(served):
    _, _, reference, eos, _ = served
    launched = _metric(served, "helios_graph_launches_total")
    for prompt in ([10, 20, 30, 40, 50], [7, 8, 9, 100, 101, 102, 103]):
        body = _post(served, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "return_token_ids": True})
        assert body["choices"][0]["token_ids"] == reference.greedy(prompt, 12, eos)
    assert _metric(served, "helios_graph_launches_total") > launched


def test_chat_renders_the_generated_template_and_generates_the_reference_tokens(served):
    _, _, reference, eos, _ = served
    body = _post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi there"}],
                                                   "max_tokens": 10, "return_token_ids": True})
    prompt = body["prompt_token_ids"]
    assert bytes(t for t in prompt if t < 256) == b"user\n\nHi thereassistant\n\n"  # bytes, then special ids
    assert prompt[0] == 256  # the template's bos_token at its declared id
    assert body["choices"][0]["token_ids"] == reference.greedy(prompt, 10, eos)


def test_prompt_logprobs_come_from_scored_prefill_and_equal_the_reference(served):
    reference = served[2]
    prompt = [10, 20, 30, 40, 50, 60]
    body = _post(served, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1})
    scores = body["choices"][0]["prompt_logprobs"]
    assert scores[0] is None
    got = [entry[str(token)]["logprob"] for entry, token in zip(scores[1:], prompt[1:])]
    assert got == pytest.approx(reference.prompt_logprobs(prompt), abs=1e-4)


def _image_url(colour) -> str:
    out = io.BytesIO()
    PIL.new("RGB", (8, 8), colour).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_an_image_is_laid_out_as_a_feature_span_and_encoded_once(served):
    _, _, reference, eos, layout = served
    url = _image_url((10, 200, 30))
    misses, hits = _metric(served, "helios_image_cache_misses_total"), _metric(served, "helios_image_cache_hits_total")
    for text in ("Look.", "See!"):  # a different text first: the second prompt's image tokens are not cached pages
        messages = [{"role": "user", "content": [{"type": "text", "text": text},
                                                 {"type": "image_url", "image_url": {"url": url}}]}]
        body = _post(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "return_token_ids": True})
        prompt = body["prompt_token_ids"]
        start = prompt.index(layout.atomic_spans[0].token_ids[0])
        # An 8 x 8 image: a 4 x 4 grid of 2 x 2 patches, merged 2 x 2: four features.
        assert prompt[start:start + 6] == [layout.atomic_spans[0].token_ids[0], *[layout.feature_ids[0]] * 4,
                                           layout.atomic_spans[1].token_ids[0]]
        assert body["choices"][0]["token_ids"] == reference.greedy(prompt, 6, eos)
    assert _metric(served, "helios_image_cache_misses_total") == misses + 1
    assert _metric(served, "helios_image_cache_hits_total") == hits + 1


def test_structured_output_goes_through_the_programs_grammar_masks(served):
    body = _post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
                                                   "response_format": {"type": "regex", "regex": "[ab]{3}x"}})
    choice = body["choices"][0]
    assert re.fullmatch("[ab]{3}x", choice["message"]["content"]) and choice["finish_reason"] == "stop"
