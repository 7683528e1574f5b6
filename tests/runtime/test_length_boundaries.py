"""Length boundaries on the real serving path, against transformers' float32 greedy choices (its
argmax after the prompt and each prefix of the served tokens, in one forward: equal to the served
tokens exactly when they are its greedy continuation).

Tiny cores with pages of 4 tokens, prefill chunks of 8 and a context extent of 48 serve prompts
whose lengths sit on, one before and one after page and chunk multiples, each with an output limit
that fills the context exactly (prompt + output == context: the last position is produced and the
request ends `length`). Prefix reuse at its edges: a cached prefix that ends at a page boundary,
one token before or after it, and one that covers the whole prompt (an identical prompt: its last
token is still computed); a continuation (the previous prompt, its output and new text); two
choices of one prompt. The same on a Mistral core whose sliding window (6 tokens) is no multiple of
the page, on a pool too small to hold every history whole, and on the Bamba hybrid (recurrent state
restored from snapshots). Over HTTP: a prompt of the whole context is a 400 naming the extent,
prompt + max_tokens == context is served, one more is a 400, and an omitted max_tokens after a
prompt of context - 1 tokens gives exactly one token.

The full sweep (every prompt length) is `python tests/runtime/test_length_boundaries.py`.
"""

from __future__ import annotations

import asyncio
import functools
import random
import sys
from pathlib import Path

import httpx
import pytest
import torch
import transformers

from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.engine import EngineRequest
from helios.runtime.loading.model import LoadOptions
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime

if __name__ == "__main__":  # the full sweep runs as a script: the tests' own imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.harness import assert_all_released  # noqa: E402
from ignition.hf_checkpoints import BAMBA, MISTRAL, QWEN3, Family  # noqa: E402
from support.chat_checkpoint import SPECIAL_TOKENS, VOCAB_SIZE, write_chat_checkpoint  # noqa: E402

NAMESPACE = "test.helios/lengths"
SERVED_ID = "lengths"
PAGE, CHUNK, CONTEXT = 4, 8, 48
# Lengths on, one before and one after every page and chunk multiple the context holds (the page
# multiples include the chunk multiples), plus the shortest and the longest prompt.
SAMPLED = sorted({1, CONTEXT - 1} | {k + d for k in range(PAGE, CONTEXT, PAGE) for d in (-1, 0, 1)} - {CONTEXT})
EOS_ID = SPECIAL_TOKENS.index("<|im_end|>")  # special tokens take the first ids
WINDOW = 6  # a sliding window that is no multiple of the page
SLIDING = Family("mistral-window", MISTRAL.config_class, MISTRAL.overrides + (("sliding_window", WINDOW),))


class Core:
    """A prepared core and its transformers reference."""

    def __init__(self, root: Path, family: Family, seed: int, **capacities):
        key = SigningKey.generate()
        checkpoint = write_chat_checkpoint(family, root / "checkpoint", seed=seed)
        plan = CapacityPlan(page_tokens=PAGE, context_tokens=CONTEXT, prefill_tokens=CHUNK, decode_batches=(1, 4),
                            token_logprobs=False, **capacities)  # no request here asks for logprobs
        prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, served_id=SERVED_ID,
                                                                          capacities=plan))
        self.core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[key.public])
        self.reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()

    def greedy(self, prompt: list[int], tokens: list[int]) -> list[int]:
        """transformers' greedy choice after `prompt` followed by each prefix of `tokens` (one float32
        forward over both): `tokens` is transformers' greedy continuation of `prompt` exactly when it
        equals this."""
        with torch.no_grad():
            ids = torch.tensor([prompt + tokens[:-1]])
            logits = self.reference(ids, attention_mask=torch.ones_like(ids)).logits
        return logits[0, len(prompt) - 1:].argmax(-1).tolist()

    def runtime(self, num_pages: int | None = None, **options):
        runtime = build_runtime(self.core, RuntimeOptions(load=LoadOptions(num_pages=num_pages), **options))
        runtime.engine.frames = 2  # a round is in flight while the next is planned
        return runtime


class Served:
    """Greedy requests run to completion on an engine driven in this thread."""

    def __init__(self, core: Core, runtime):
        self.core, self.engine = core, runtime.engine
        self.count = 0

    def run(self, *requests: tuple[list[int], int], **options) -> list[tuple[list[int], FinishEvent]]:
        """Submits every (prompt, max_tokens) at once with `options` (RequestSpec fields); returns
        each one's tokens and finish event."""
        tokens: dict[str, list[int]] = {}
        finishes: dict[str, FinishEvent] = {}

        def record(event) -> None:
            if isinstance(event, TokenEvent):
                tokens[event.request_id].extend(event.token_ids)
            else:
                finishes[event.request_id] = event

        ids = []
        for prompt, max_tokens in requests:
            self.count += 1
            ids.append(request_id := f"r{self.count}")
            tokens[request_id] = []
            self.engine.submit(EngineRequest(RequestSpec(request_id, tuple(prompt), max_tokens, **options), record))
        self.engine.run_until_idle()
        return [(tokens[i], finishes[i]) for i in ids]

    def check(self, *requests: tuple[list[int], int], **options) -> list[FinishEvent]:
        """Runs `requests`; each gave transformers' tokens, all of its limit, and ended `length`."""
        finishes = []
        for (prompt, max_tokens), (tokens, finish) in zip(requests, self.run(*requests, **options)):
            where = f"prompt of {len(prompt)} tokens, max_tokens {max_tokens}"
            assert finish.reason == FinishReason.LENGTH, (where, finish.reason, finish.message)
            assert len(tokens) == max_tokens and tokens == self.core.greedy(prompt, tokens), where
            assert finish.num_output_tokens == max_tokens, where
            finishes.append(finish)
        return finishes

    def assert_released(self) -> None:
        scheduler = self.engine.scheduler
        scheduler.check_invariants()
        assert scheduler.counters().num_inflight_plans == 0
        assert_all_released(scheduler)


def random_ids(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(1, VOCAB_SIZE) for _ in range(length)]


@functools.cache
def prepared(base: Path, name: str) -> Core:
    families = {"dense": (QWEN3, 5, {}), "sliding": (SLIDING, 11, {}), "hybrid": (BAMBA, 4, {})}
    family, seed, capacities = families[name]
    return Core(base / f"lengths-{name}", family, seed, **capacities)


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Core:
    return prepared(tmp_path_factory.getbasetemp(), "dense")


@pytest.fixture(scope="module")
def sliding(tmp_path_factory) -> Core:
    return prepared(tmp_path_factory.getbasetemp(), "sliding")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Core:
    return prepared(tmp_path_factory.getbasetemp(), "hybrid")


@pytest.fixture(scope="module")
def dense_served(dense):
    runtime = dense.runtime()
    yield Served(dense, runtime)
    runtime.close()


# -- prompt lengths ---------------------------------------------------------------------------------

def test_every_sampled_prompt_length_fills_the_context(dense_served):
    rng = random.Random(1)
    for length in SAMPLED:
        dense_served.check((random_ids(rng, length), CONTEXT - length))
    dense_served.assert_released()


def test_a_batch_at_neighbouring_lengths_fills_the_context_together(dense_served):
    """Rows one token apart, each to the end of the context: their last rounds run together."""
    rng = random.Random(2)
    for length in (PAGE * 3, CHUNK * 3, CONTEXT - PAGE):
        prompts = [random_ids(rng, length + d) for d in (-1, 0, 1)]
        dense_served.check(*((prompt, CONTEXT - len(prompt)) for prompt in prompts))
    dense_served.assert_released()


# -- cached prefixes --------------------------------------------------------------------------------

@pytest.mark.parametrize("shared", [3 * PAGE, 4 * PAGE - 1, 4 * PAGE, 4 * PAGE + 1, 5 * PAGE - 1])
def test_a_cached_prefix_ending_at_and_around_a_page_boundary(dense_served, shared):
    rng = random.Random(shared)
    first = random_ids(rng, 5 * PAGE + 2)
    dense_served.check((first, 2))
    prompt = first[:shared] + random_ids(rng, 7)
    (finish,) = dense_served.check((prompt, CONTEXT - len(prompt)))
    assert finish.num_reused_tokens == shared // PAGE * PAGE  # the complete pages of the shared prefix
    dense_served.assert_released()


@pytest.mark.parametrize("length", [5 * PAGE, 5 * PAGE + 1, CONTEXT - 1], ids=["page-multiple", "page+1", "context-1"])
def test_an_identical_prompt_still_computes_its_last_token(dense_served, length):
    rng = random.Random(length)
    prompt = random_ids(rng, length)
    dense_served.check((prompt, 1))
    (finish,) = dense_served.check((prompt, CONTEXT - length))
    assert PAGE * ((length - 1) // PAGE) <= finish.num_reused_tokens < length
    dense_served.assert_released()


@pytest.mark.parametrize("length", [PAGE * 3 - 2, PAGE * 3, CHUNK * 2 + 1])
def test_a_continuation_reuses_the_previous_turn_and_fills_the_context(dense_served, length):
    rng = random.Random(100 + length)
    prompt = random_ids(rng, length)
    (output, finish), = dense_served.run((prompt, 3), publish_snapshot=True)
    assert finish.reason == FinishReason.LENGTH and len(output) == 3
    assert output == dense_served.core.greedy(prompt, output)
    follow = prompt + output + random_ids(rng, 2)
    (finish,) = dense_served.check((follow, CONTEXT - len(follow)), publish_snapshot=True)
    assert finish.num_reused_tokens == (length + 2) // PAGE * PAGE  # every complete page it wrote
    dense_served.assert_released()


@pytest.mark.parametrize("length", [PAGE * 5, CONTEXT - 2, CONTEXT - 1])
def test_two_choices_of_one_prompt_fill_the_context(dense_served, length):
    prompt = random_ids(random.Random(200 + length), length)
    dense_served.check((prompt, CONTEXT - length), (prompt, CONTEXT - length))
    dense_served.assert_released()


# -- a sliding window no multiple of the page ------------------------------------------------------

def test_sliding_window_lengths_and_reuse_fill_the_context(sliding):
    """A pool of 14 pages (a whole history takes 12): two histories at once must release the pages
    that left the window, or preempt."""
    runtime = sliding.runtime(num_pages=14)
    served = Served(sliding, runtime)
    try:
        rng = random.Random(3)
        for length in SAMPLED[::2]:
            prompt = random_ids(rng, length)
            other = random_ids(rng, max(1, CONTEXT - length - 1))
            served.check((prompt, CONTEXT - length), (other, CONTEXT - len(other)))
            prompt = prompt[:length // PAGE * PAGE] + random_ids(rng, 3)[:CONTEXT - 1 - length // PAGE * PAGE]
            served.check((prompt, CONTEXT - len(prompt)))
        served.assert_released()
    finally:
        runtime.close()


# -- the hybrid: recurrent state restored from snapshots --------------------------------------------

def test_hybrid_lengths_and_snapshot_continuations_fill_the_context(hybrid):
    runtime = hybrid.runtime()
    served = Served(hybrid, runtime)
    try:
        rng = random.Random(4)
        for length in (1, PAGE - 1, PAGE, CHUNK + 1, 3 * PAGE, CONTEXT - 6):
            prompt = random_ids(rng, length)
            (output, finish), = served.run((prompt, 2), publish_snapshot=True)
            assert len(output) == 2 and output == hybrid.greedy(prompt, output)
            follow = prompt + output + random_ids(rng, 1)
            (finish,) = served.check((follow, CONTEXT - len(follow)), publish_snapshot=True)
            assert finish.num_reused_tokens == length + 1  # the snapshot where the first turn ended
            served.check((follow, CONTEXT - len(follow)))  # the whole prompt published: recomputed
        assert runtime.engine.scheduler.counters().snapshots_restored >= 6
        served.assert_released()
    finally:
        runtime.close()


# -- what a client gets over HTTP -------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(dense):
    from helios.server.app import create_app
    from helios.server.service import ServedModel

    runtime = dense.runtime()
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1, owned_by=NAMESPACE)
    served.start()
    app = create_app(served)
    with asyncio.Runner() as runner:
        def post(path: str, body: dict) -> httpx.Response:
            async def call():
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
                    return await http.post(path, json={"model": SERVED_ID, "temperature": 0, **body})
            return runner.run(call())
        yield post
    served.shutdown()


def test_http_prompt_of_the_whole_context_is_a_400_naming_the_extent(client):
    prompt = random_ids(random.Random(5), CONTEXT)
    for limit in ({}, {"max_tokens": 1}):
        response = client("/v1/completions", {"prompt": prompt, **limit})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "prompt" and f"context extent is {CONTEXT} tokens" in error["message"]


def test_http_prompt_and_limit_filling_the_context_is_served_one_more_is_a_400(dense, client):
    prompt = random_ids(random.Random(6), CONTEXT - 9)
    body = {"prompt": prompt, "max_tokens": 9, "return_token_ids": True}
    response = client("/v1/completions", body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    tokens = choice["token_ids"]
    assert choice["finish_reason"] == "length" and len(tokens) == 9 and tokens == dense.greedy(prompt, tokens)
    assert response.json()["usage"]["total_tokens"] == CONTEXT
    response = client("/v1/completions", {**body, "max_tokens": 10})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and f"context extent of {CONTEXT} tokens" in error["message"]


def test_http_omitted_limit_after_a_prompt_of_context_minus_one_gives_one_token(dense, client):
    prompt = random_ids(random.Random(7), CONTEXT - 1)
    response = client("/v1/completions", {"prompt": prompt, "n": 2, "return_token_ids": True})
    assert response.status_code == 200, response.text
    for choice in response.json()["choices"]:
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 1
        assert choice["token_ids"] == dense.greedy(prompt, choice["token_ids"])
    usage = response.json()["usage"]
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": CONTEXT - 1, "completion_tokens": 2, "total_tokens": CONTEXT + 1}


def test_http_chat_limit_filling_the_context_is_served_one_more_is_a_400(client):
    messages = [{"role": "user", "content": "hello world, how are you today?"}]
    response = client("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "return_token_ids": True})
    assert response.status_code == 200, response.text
    room = CONTEXT - len(response.json()["prompt_token_ids"])
    response = client("/v1/chat/completions", {"messages": messages, "max_tokens": room, "n": 2})
    assert response.status_code == 200, response.text
    assert all(c["finish_reason"] in ("length", "stop") for c in response.json()["choices"])
    response = client("/v1/chat/completions", {"messages": messages, "max_tokens": room + 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens", response.text



def test_http_echo_without_output_ends_length_where_the_hidden_token_is_eos(client):
    """max_tokens 0 with echo: the one token the prefill samples is hidden, so the request ends
    `length` (with no output) even where that token is the end of sequence or a stop token."""
    messages = [{"role": "user", "content": "hello world " * 3}]
    response = client("/v1/chat/completions", {"messages": messages, "return_token_ids": True})
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "stop"  # the greedy reply ends with the end of sequence
    reply = [token for token in choice["token_ids"] if token != EOS_ID]
    prompt = response.json()["prompt_token_ids"] + reply  # its next greedy token is the EOS
    first = response.json()["prompt_token_ids"]  # its next greedy token is the reply's first
    for body in ({"prompt": prompt}, {"prompt": first, "stop_token_ids": [reply[0]]}):
        response = client("/v1/completions", {**body, "max_tokens": 0, "echo": True})
        assert response.status_code == 200, response.text
        (choice,) = response.json()["choices"]
        assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == 0


# -- the full sweep, outside the suite -------------------------------------------------------------

def full_sweep(base: Path) -> None:
    """Every prompt length from 1 to CONTEXT - 1 on each core, alone and repeated (whole prompt
    cached), each filling the context; prints each mismatch and the count."""
    failures = 0
    for name in ("dense", "sliding", "hybrid"):
        core = prepared(base, name)
        runtime = core.runtime()
        served = Served(core, runtime)
        rng = random.Random(9)
        for length in range(1, CONTEXT):
            prompt = random_ids(rng, length)
            for attempt in ("cold", "repeat"):
                try:
                    served.check((prompt, CONTEXT - length), publish_snapshot=True)
                except AssertionError as error:
                    failures += 1
                    print(name, attempt, length, error)
        served.assert_released()
        runtime.close()
        print(name, "done")
    print("failures:", failures)


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        full_sweep(Path(directory))
