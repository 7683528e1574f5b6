"""Usage and /metrics against ground truth the server does not compute.

A seeded workload (chat and text completions; text, token-id and batched prompts; client text
holding marker strings; ``n`` 1 to 3; ``max_tokens`` cut-offs, omitted, or at and past the context
extent; stop strings and stop token ids taken from the output they cut; EOS forced by
``logit_bias``; reasoning opened by ``logit_bias`` on ``<think>``; ``echo`` with ``max_tokens`` 0
and more; log-probabilities; observed ids; sampled choices with EOS banned; streamed and not;
invalid bodies; clients that leave mid-stream or before their answer) runs against the tiny served
core in this process. Every expectation comes from outside the server:

- prompt tokens: ``transformers``' ``apply_chat_template`` over the checkpoint's own chat template
  and tokenizer (chat; marker strings in client text tokenized as text, as the README promises),
  the tokenizer (text), the list itself (token ids); each prompt once for ``n`` > 1, summed over a
  batch's prompts; an observed response's ``prompt_token_ids`` are those ids;
- completion tokens: a greedy continuation from ``transformers``' float32 model of the same
  checkpoint (with the request's ``logit_bias``), cut where OpenAI's usage cuts it: at
  ``max_tokens``, at the EOS token (counted: it was generated), or at the token that completes a
  stop string or stop token sequence (counted: the stop hides text, not the tokens generated);
  ``echo`` adds nothing; sampled choices with EOS banned make exactly ``max_tokens`` each; an
  observed choice's ``token_ids`` are the continuation so cut, and its log-probability entries one
  per token but an EOS (without stops, which hide entries with their text);
- the same request streamed with ``include_usage`` reports the usage its JSON body reports;
- ``reused_prompt_tokens`` (this server's report of the prefix the cache served, which usage's
  ``prompt_tokens_details.cached_tokens`` repeats) follows the rule of
  `helios.runtime.cache.cache_manager`: complete 16-token pages of the longest prefix an earlier
  request committed, never the last prompt token;
  a later choice of ``n`` reuses all but the last prompt token (on the first choice's pages) or,
  where the first ended before it was admitted, the first's cached pages;
- /metrics after the workload, as differences from a scrape before it: prompt and generated token
  counters and the token histograms' sums equal the ground truth (a client that left counts as its
  access-log record, whose prompt is the ground truth and whose output is at most the ground
  truth), requests finished by reason and admitted per choice, HTTP responses by endpoint and
  status (400s and 499s included), the latency histograms' observations, the prefix lookup and
  reuse counters, in-flight gauges back at zero, and every page either free or cached, the pages
  the cache sequence cached exactly the distinct complete pages it committed less those it evicted.

The second test runs the same workloads on a server with pages for a context and a quarter, where
requests are preempted and recomputed and pages evicted (the cache sequence's reuse is not
predicted there). ``HELIOS_USAGE_ROUNDS`` (default 1) runs more seeded workloads, from
``HELIOS_USAGE_SEED``, and ``HELIOS_USAGE_SPECULATIVE=1`` serves the first test's from a core with a
draft (the sweeps outside the suite).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import tokenizers
import torch
import transformers
from prometheus_client.parser import text_string_to_metric_families

from helios.server.app import create_app
from support.asgi_scope import post_scope
from support.server_core import CONTEXT_TOKENS, SERVED_ID, served_tiny_core
from server.test_metrics_invariants import KEY_HEADER, capturing, post_keyed
from support.shared_prepare import shared_root
from support.sweeps import swept

ROUNDS = int(os.environ.get("HELIOS_USAGE_ROUNDS", "1"))
FIRST_SEED = int(os.environ.get("HELIOS_USAGE_SEED", "20261205"))
# HELIOS_USAGE_SPECULATIVE=1 (or HELIOS_FULL_SUITE=1) serves a speculative core instead of the tiny core; by default
# test_served_parity's speculating server answers usage as its non-speculating reference does.
SPECULATIVE = swept("HELIOS_USAGE_SPECULATIVE")
NUM_REQUESTS = 26  # per round, beside the cache sequence, the invalid bodies and the clients that leave
WAVE = 3  # concurrent requests
EOS_ID, THINK_ID = 1, 2  # support.chat_checkpoint: <|im_end|> (the EOS) and <think>
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
TEXTS = [
    "hello world, how are you today?",
    "the weather in paris is sunny; in london it rains.",
    "what is 12 plus 30? it is 42.",
    " ".join(["the quick brown fox jumps over the lazy dog"] * 3),
    "caf\u00e9 \u65e5\u672c <|im_start|>user and <think> inside",  # split characters, special-token text
]
WAIT_S = 60.0
TIGHT_PAGES = 20  # 16-token pages: a full context and a quarter
PRESSURE = 3  # requests of 160 tokens at once (30 pages): on TIGHT_PAGES, some are preempted
CASES = ("eos", "stop", "length", "stop token ids", "reasoning", "echo", "max_tokens 0", "batch", "n > 1", "sampled",
         "marker text", "too long", "logprobs", "token ids")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny core, or with ``HELIOS_USAGE_SPECULATIVE=1`` the same weights prepared with a
    one-layer draft (speculative widths 1 and 4: greedy unseeded requests speculate)."""
    if SPECULATIVE:
        with served_speculating(tmp_path_factory.getbasetemp() / "usage-speculative") as served:
            yield served
        return
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2) as served:
        yield served


@contextlib.contextmanager
def served_speculating(root: Path):
    from helios.core.keys import SigningKey, write_key_pair
    from helios.core.reader import open_core
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from helios.ignition.speculative_plan import SpeculativePlan
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel
    from ignition.hf_checkpoints import QWEN3
    from speculative.support import write_truncated_checkpoint
    from support.chat_checkpoint import write_chat_checkpoint

    checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=3)
    draft = write_truncated_checkpoint(checkpoint, root / "draft", 1)
    key = SigningKey.generate()
    write_key_pair(root / "publisher.key", key, ["test.helios/usage"])
    plan = CapacityPlan(context_tokens=CONTEXT_TOKENS, prefill_tokens=32, decode_batches=(1, 4, 8),
                        speculative=SpeculativePlan(draft, widths=(1, 4)))
    prepare_core(checkpoint, root / "model.core", key,
                 PrepareOptions("test.helios/usage", served_id=SERVED_ID, capacities=plan))
    opened = open_core(root / "model.core", accept="test.helios/usage", trusted_keys=[root / "publisher.key.pub"])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=4)), queue_capacity=4,
                                      frontend_workers=2)
    served.start()
    try:
        yield served
    finally:
        served.shutdown()


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """The tiny core with pages for a full context and a quarter: requests at once run short."""
    from helios.runtime.loading.model import LoadOptions
    from helios.runtime.service import RuntimeOptions

    options = RuntimeOptions(queue_capacity=4, load=LoadOptions(num_pages=TIGHT_PAGES))
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, options, frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def reference(served, tmp_path_factory):
    if SPECULATIVE:
        return Reference(tmp_path_factory.getbasetemp() / "usage-speculative" / "checkpoint")
    return Reference(shared_root(tmp_path_factory.getbasetemp()) / "helios-server-core" / "checkpoint")


class Reference:
    """The checkpoint the core was prepared from, read by `transformers`: prompt ids and greedy
    continuations (float32, the request's logit bias added to every step's logits)."""

    def __init__(self, checkpoint: Path):
        config = json.loads((checkpoint / "tokenizer_config.json").read_text())
        self.tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
        self.tokenizer.chat_template = config["chat_template"]
        self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self._literal = tokenizers.Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self._literal.encode_special_tokens = True
        self._continuations: dict[tuple, list[int]] = {}

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """`apply_chat_template`'s ids, except that marker strings in client text are text (README:
        "Client text is text", as ``encode_special_tokens=True`` would tokenize them): the template
        renders the messages with a private-use character in place of each marker, the rendered
        text splits at the template's markers, and each piece between them, the markers put back,
        is encoded with no added vocabulary."""
        markers = sorted(self.tokenizer.get_added_vocab(), key=len, reverse=True)
        stand_ins = {marker: chr(0xE000 + index) for index, marker in enumerate(markers)}

        def hidden(text: str) -> str:
            for marker, stand_in in stand_ins.items():
                text = text.replace(marker, stand_in)
            return text

        rendered = self.tokenizer.apply_chat_template(
            [{**message, "content": hidden(message["content"])} for message in messages],
            add_generation_prompt=True, tokenize=False)
        ids = []
        for piece in re.split("(" + "|".join(map(re.escape, markers)) + ")", rendered):
            if piece in stand_ins:
                ids.append(self.tokenizer.convert_tokens_to_ids(piece))
            elif piece:
                for marker, stand_in in stand_ins.items():
                    piece = piece.replace(stand_in, marker)
                ids += self._literal.encode(piece, add_special_tokens=False).ids
        return ids

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)

    def greedy(self, prompt_ids: list[int], length: int, bias: dict[int, float]) -> list[int]:
        key = (tuple(prompt_ids), tuple(sorted(bias.items())))
        ids = self._continuations.setdefault(key, [])
        with torch.no_grad():
            while len(ids) < length:
                logits = self.model(torch.tensor([list(prompt_ids) + ids])).logits[0, -1].double()
                for token, value in bias.items():
                    logits[token] += value
                ids.append(int(torch.argmax(logits)))
        return ids[:length]


def num_generated(reference: Reference, continuation: list[int], max_tokens: int, stops: list[str],
                  sequences: list[list[int]] = ()) -> tuple[int, str]:
    """Tokens a greedy choice generates, as OpenAI's usage counts them, and its finish reason
    (``eos`` or ``stop`` or ``length``, as /metrics labels them): a stop string or stop token
    sequence ends it at the token that completes it, that token counted."""
    for count in range(1, max_tokens + 1):
        if continuation[count - 1] == EOS_ID:
            return count, "eos"
        if stops and any(stop in reference.decode(continuation[:count]) for stop in stops):
            return count, "stop"
        if any(count >= len(seq) and continuation[count - len(seq):count] == seq for seq in sequences):
            return count, "stop"
    return max_tokens, "length"


# -- the workload --------------------------------------------------------------------------------------


@dataclass
class Request:
    """One request, what the ground truth says of it, and what its client saw."""

    key: str
    endpoint: str
    body: dict | bytes
    kind: str = "ok"  # ok, invalid, gone
    prompts: list[list[int]] = field(default_factory=list)  # each prompt's ids (the ground truth)
    continuations: list[list[int]] | None = None  # each prompt's greedy continuation (None: sampled)
    expected_status: str = "200"
    status: str = ""
    usage: dict | None = None
    reused: int | None = None
    finishes: list[str] = field(default_factory=list)
    num_entries: dict[int, int] = field(default_factory=collections.Counter)  # log-probability entries by choice
    token_ids: dict[int, list[int]] = field(default_factory=lambda: collections.defaultdict(list))  # by choice
    prompt_ids: dict[int, list[int]] = field(default_factory=dict)  # by choice (-1: the top level's)
    record: object = None

    @property
    def n(self) -> int:
        return self.body.get("n", 1)

    def expected_usage(self, reference: Reference) -> dict:
        prompt = sum(len(ids) for ids in self.prompts)
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens(reference),
                "total_tokens": prompt + self.completion_tokens(reference)}

    @property
    def max_tokens(self) -> int:
        """The output limit: as given, else the rest of the context (the tiny core's default limit is larger)."""
        given = self.body.get("max_tokens", self.body.get("max_completion_tokens"))
        return CONTEXT_TOKENS - max(map(len, self.prompts)) if given is None else given

    def choice_outcomes(self, reference: Reference) -> list[tuple[int, str]]:
        """(tokens, finish reason) of every choice, by the ground truth."""
        max_tokens = self.max_tokens
        if max_tokens == 0:
            return [(0, "length")] * (self.n * len(self.prompts))
        if self.continuations is None:  # sampled, EOS banned, no stops
            return [(max_tokens, "length")] * (self.n * len(self.prompts))
        stops = self.body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        sequences = [[t] for t in self.body.get("stop_token_ids", [])] + self.body.get("stop_token_sequences", [])
        return [num_generated(reference, c, max_tokens, stops, sequences)
                for c in self.continuations for _ in range(self.n)]

    def completion_tokens(self, reference: Reference) -> int:
        return sum(count for count, _ in self.choice_outcomes(reference))


def plan_request(rng: random.Random, reference: Reference, key: str, draw: float | None = None) -> Request:
    """A random request; `draw` picks its logit bias (below 0.15 EOS, below 0.25 ``<think>``)."""
    endpoint = rng.choice(["chat", "completions"])
    body: dict = {"model": SERVED_ID, "max_tokens": rng.randint(1, 8), "n": rng.choice([1, 1, 2, 3])}
    bias: dict[int, float] = {}
    draw = rng.random() if draw is None else draw
    if draw < 0.15:
        bias[EOS_ID] = rng.choice([3.0, 8.0, 100.0])  # EOS soon, or at once
    elif draw < 0.25:
        bias[THINK_ID] = 100.0  # reasoning opens: its tokens count as any others
    if endpoint == "chat":
        messages = [{"role": "user", "content": rng.choice(TEXTS)}]
        if rng.random() < 0.3:
            messages = [{"role": "system", "content": rng.choice(TEXTS)},
                        *messages, {"role": "assistant", "content": rng.choice(TEXTS)},
                        {"role": "user", "content": rng.choice(TEXTS)}]
        body["messages"] = messages
        prompts = [reference.chat_ids(messages)]
    else:
        shape = rng.choice(["text", "text", "ids", "batch", "id batch"])
        if shape in ("text", "batch"):
            texts = [rng.choice(TEXTS) for _ in range(1 if shape == "text" else rng.randint(2, 3))]
            body["prompt"] = texts[0] if shape == "text" else texts
            prompts = [reference.text_ids(t) for t in texts]
        else:
            prompts = [[rng.randrange(6, 320) for _ in range(rng.randint(1, 40))]
                       for _ in range(1 if shape == "ids" else 2)]
            body["prompt"] = prompts[0] if shape == "ids" else prompts
        if len(prompts) > 1:
            body["n"] = rng.choice([1, 2])
        if rng.random() < 0.25:
            body["echo"] = True
            body["max_tokens"] = rng.choice([0, body["max_tokens"]])
    request = Request(key, endpoint, body, prompts=prompts)
    if any(len(ids) + body["max_tokens"] > CONTEXT_TOKENS for ids in prompts):
        request.kind, request.expected_status = "too long", "400"  # README: beyond the context extent
    if rng.random() < 0.2 and not bias and body["max_tokens"]:
        body.update(temperature=1.0, seed=rng.randrange(1000), logit_bias={str(EOS_ID): -100})
        return request
    body["temperature"] = 0
    if bias:
        body["logit_bias"] = {str(token): value for token, value in bias.items()}
    request.continuations = [reference.greedy(ids, body["max_tokens"], bias) for ids in prompts]
    draw = rng.random()
    if draw < 0.4 and body["max_tokens"] > 1:  # a stop taken from the output it cuts
        text = reference.decode(request.continuations[0])
        start = rng.randrange(len(text)) if text else 0
        stop = text[start:start + rng.randint(1, 3)]
        if stop and "\ufffd" not in stop:  # a stray byte's U+FFFD is no text a stop can match
            body["stop"] = stop if rng.random() < 0.3 else [stop] + rng.sample(["zz", "\n\n\n"], rng.randint(0, 1))
    elif draw < 0.55 and body["max_tokens"] > 1:  # stop token ids, or a sequence of them, from the output
        ids = request.continuations[0]
        start = rng.randrange(len(ids))
        if rng.random() < 0.5:
            body["stop_token_ids"] = [ids[start]]
        else:
            body["stop_token_sequences"] = [ids[start:start + rng.randint(1, 3)]]
    if rng.random() < 0.3:  # observed: the ids of the prompt and of every token generated
        body["return_token_ids"] = True
    if rng.random() < 0.3 and not body.get("echo"):  # entries to count: one per token shown
        body["logprobs"] = True if endpoint == "chat" else 0
    if endpoint == "chat" and rng.random() < 0.3:
        body["max_completion_tokens"] = body.pop("max_tokens")
    return request


def invalid_request(rng: random.Random, reference: Reference, key: str) -> Request:
    request = plan_request(rng, reference, key)
    case = rng.choice(["n", "max_tokens", "unknown", "json"])
    body = dict(request.body)
    if case == "n":
        body["n"] = 0
    elif case == "max_tokens":
        body["max_tokens"] = -1
    elif case == "unknown":
        body["suffix"] = "x"
    return Request(key, request.endpoint, b'{"model": ' if case == "json" else body, kind="invalid",
                   expected_status="400")


def boundary_requests(rng: random.Random, reference: Reference, tag: int) -> list[Request]:
    """Token-id prompts whose prompt and ``max_tokens`` fill the context extent, and one past it."""
    requests = []
    for index, num_prompt in enumerate((CONTEXT_TOKENS - 6, CONTEXT_TOKENS - 5)):
        prompt = [rng.randrange(6, 320) for _ in range(num_prompt)]
        body = {"model": SERVED_ID, "prompt": prompt, "max_tokens": 6, "temperature": 0}
        request = Request(f"b{tag}-{index}", "completions", body, prompts=[prompt])
        if index:
            request.kind, request.expected_status = "too long", "400"
        else:
            request.continuations = [reference.greedy(prompt, 6, {})]
        requests.append(request)
    for index, num_prompt in enumerate((CONTEXT_TOKENS - 9, CONTEXT_TOKENS), 2):  # no max_tokens: the rest
        prompt = [rng.randrange(6, 320) for _ in range(num_prompt)]
        body = {"model": SERVED_ID, "prompt": prompt, "temperature": 0, "logit_bias": {str(EOS_ID): -100}}
        request = Request(f"b{tag}-{index}", "completions", body, prompts=[prompt])
        if num_prompt < CONTEXT_TOKENS:
            request.continuations = [reference.greedy(prompt, CONTEXT_TOKENS - num_prompt, {EOS_ID: -100})]
        else:
            request.kind, request.expected_status = "too long", "400"
        requests.append(request)
    return requests


def leaving_request(rng: random.Random, reference: Reference, key: str) -> Request:
    """A long greedy stream whose client leaves after a few chunks."""
    request = plan_request(rng, reference, key)
    while (request.continuations is None or request.max_tokens == 0
           or max(map(len, request.prompts)) > CONTEXT_TOKENS - 40):
        request = plan_request(rng, reference, key)
    body = {k: v for k, v in request.body.items()
            if k not in ("stop", "stop_token_ids", "stop_token_sequences", "logit_bias", "max_completion_tokens")}
    body.update(stream=True, max_tokens=40, n=rng.choice([1, 2]))
    request.body, request.kind = body, "gone"
    request.continuations = [reference.greedy(ids, 40, {}) for ids in request.prompts]
    return request


def cache_sequence(rng: random.Random, reference: Reference, tag: int) -> list[Request]:
    """Greedy token-id prompts, one at a time, over shared prefixes: a prompt again, a part of it, a
    prompt extended, one shorter than a page past a shared page, an ``n`` of 2, and unrelated ones."""
    base = [rng.randrange(6, 320) for _ in range(37)] + [tag % 300 + 6]
    other = [rng.randrange(6, 320) for _ in range(21)]
    extension = [rng.randrange(6, 320) for _ in range(25)]
    prompts = [base, base, base[:20] + other, base + extension, base[:16], base[:17], other, other + base,
               base[:33] + other]
    requests = []
    for index, prompt in enumerate(prompts):
        body = {"model": SERVED_ID, "prompt": prompt, "max_tokens": rng.randint(1, 4), "temperature": 0,
                "n": 2 if index == 6 else 1, "return_token_ids": True}
        if rng.random() < 0.5:
            body.update(stream=True, stream_options={"include_usage": True})
        request = Request(f"c{tag}-{index}", "completions", body, prompts=[prompt])
        request.continuations = [reference.greedy(prompt, body["max_tokens"], {})]
        requests.append(request)
    return requests


# -- running requests ------------------------------------------------------------------------------------


def read_sse(text: str, request: Request) -> None:
    finishes: dict[int, str] = {}
    lines = text.split("\n")
    assert lines[-3:] == ["data: [DONE]", "", ""], text[-300:]
    for line in lines:
        assert line != "event: error", text
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        if "prompt_token_ids" in chunk:
            request.prompt_ids.setdefault(-1, chunk["prompt_token_ids"])
        for choice in chunk["choices"]:
            if choice.get("finish_reason"):
                finishes[choice["index"]] = choice["finish_reason"]
            request.num_entries[choice["index"]] += num_entries(choice.get("logprobs"))
            request.token_ids[choice["index"]] += choice.get("token_ids") or []
            if "prompt_token_ids" in choice:
                request.prompt_ids[choice["index"]] = choice["prompt_token_ids"]
        if chunk.get("usage"):
            assert request.usage is None, "two usage chunks"
            request.usage = chunk["usage"]
        if "reused_prompt_tokens" in chunk:
            request.reused = chunk["reused_prompt_tokens"]
    request.finishes = [finishes[i] for i in sorted(finishes)]


def num_entries(logprobs: dict | None) -> int:
    """Token entries of a choice's (or a chunk's) ``logprobs``: chat's ``content``, completions' ``tokens``."""
    if not logprobs:
        return 0
    return len(logprobs.get("content") or logprobs.get("tokens") or [])


async def send(client: httpx.AsyncClient, request: Request) -> None:
    response = await post_keyed(client, PATHS[request.endpoint], request.body, request.key)
    request.status = str(response.status_code)
    if response.status_code != 200:
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        read_sse(response.text, request)
    else:
        data = response.json()
        request.usage = data["usage"]
        request.reused = data.get("reused_prompt_tokens")
        request.finishes = [choice["finish_reason"] for choice in data["choices"]]
        if "prompt_token_ids" in data:
            request.prompt_ids[-1] = data["prompt_token_ids"]
        for choice in data["choices"]:
            request.num_entries[choice["index"]] += num_entries(choice.get("logprobs"))
            request.token_ids[choice["index"]] += choice.get("token_ids") or []
            if "prompt_token_ids" in choice:
                request.prompt_ids[choice["index"]] = choice["prompt_token_ids"]


async def send_and_leave(app, request: Request, leave_after: int) -> None:
    """The request through the ASGI app with a client that leaves: a stream after `leave_after` body
    messages, a JSON request at once (499 if it left before the answer started, as /metrics counts it)."""
    body = json.dumps(request.body).encode()
    path = PATHS[request.endpoint]
    scope = post_scope(path, body, ((KEY_HEADER.encode(), request.key.encode()),))
    requested, gone = asyncio.Event(), asyncio.Event()
    num_bodies = 0

    async def receive():
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        if request.body["stream"]:
            await gone.wait()
        gone.set()
        return {"type": "http.disconnect"}

    async def sending(message):
        nonlocal num_bodies
        if message["type"] == "http.response.start":
            request.status = "499" if gone.is_set() else str(message["status"])
        elif message["type"] == "http.response.body" and not gone.is_set():
            num_bodies += 1
            if num_bodies >= leave_after or not message.get("more_body", False):
                gone.set()

    await asyncio.wait_for(app(scope, receive, sending), WAIT_S)


async def idle(served, records: dict, keys: list[str]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S

    def ended(record) -> bool:
        return record is not None and all(r.num_prompt_tokens is not None for r in (record, *record.choices))

    def is_idle() -> bool:
        counters, stats = served.engine.scheduler.counters(), served.stats()
        return (served.admission.in_use == 0 and counters.num_running == 0 and counters.num_waiting == 0
                and stats.active_requests == 0 and stats.queued_requests == 0
                and all(ended(records.get(key)) for key in keys))

    while not is_idle():
        if asyncio.get_running_loop().time() > deadline:
            pending = {key: records.get(key) for key in keys if not ended(records.get(key))}
            raise AssertionError(f"the server did not go idle: {served.admission.in_use} permits in use, "
                                 f"{served.engine.scheduler.counters()}, records not ended: {pending}")
        await asyncio.sleep(0.01)


def scrape(served) -> dict:
    samples = collections.Counter()
    for family in text_string_to_metric_families(served.metrics.render().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def deltas_by(before: dict, after: dict, name: str, *labels: str) -> dict:
    found = {}
    for key in set(before) | set(after):
        if key[0] == name:
            value = after.get(key, 0.0) - before.get(key, 0.0)
            if value:
                found[tuple(dict(key[1])[label] for label in labels)] = value
    return found


# -- the ground truth of the cache -----------------------------------------------------------------


def committed_pages(history: list[int], page: int) -> set[tuple[int, ...]]:
    """Every complete page of `history`, as its whole prefix (a page's digest chains its prefix)."""
    return {tuple(history[:end]) for end in range(page, len(history) + 1, page)}


def expected_reuse(prompt: list[int], cached: set[tuple[int, ...]], page: int) -> int:
    """Complete pages of the prompt's leading run in the cache, never the last prompt token."""
    num = 0
    while (num + 1) * page <= len(prompt) - 1 and tuple(prompt[:(num + 1) * page]) in cached:
        num += 1
    return num * page


# -- the test ------------------------------------------------------------------------------------------------


@dataclass
class Round:
    """One seeded workload, what the server said of it, and every discrepancy found."""

    seed: int
    mixed: list[Request]  # sent in concurrent waves (valid, invalid, twins)
    pressure: list[Request]  # long requests at once: on a server short of pages, preempted
    gone: list[Request]  # clients that leave, one at a time
    cached_run: list[Request]  # the cache sequence, one at a time
    seen_cases: collections.Counter
    records: dict = field(default_factory=dict)  # access-log records by test key
    before: dict = field(default_factory=dict)  # /metrics samples before the workload
    after: dict = field(default_factory=dict)  # and after it, the server idle
    cache_stats: list = field(default_factory=list)  # the worker's stats before and after the cache sequence
    num_evictions: int = 0  # pages the cache sequence evicted
    problems: list[str] = field(default_factory=list)

    @property
    def every(self) -> list[Request]:
        return self.mixed + self.pressure + self.gone + self.cached_run

    @property
    def ok(self) -> list[Request]:
        return [r for r in self.every if r.kind == "ok"]

    def check(self, what: str, seen, expected) -> None:
        if seen != expected:
            self.problems.append(f"seed {self.seed}: {what}: server says {seen}, ground truth {expected}")


def plan_round(rng: random.Random, reference: Reference, seed: int, seen_cases: collections.Counter) -> Round:
    requests = [plan_request(rng, reference, f"s{seed}-{i}", 0.2 if i == 0 else None) for i in range(NUM_REQUESTS)]
    twins = [Request(r.key + "-twin", r.endpoint, {**r.body, "stream": not r.body.get("stream", False)}, r.kind,
                     r.prompts, r.continuations, r.expected_status) for r in requests[::2]]
    for twin in twins:
        if twin.body["stream"]:
            twin.body["stream_options"] = {"include_usage": True}
        else:
            twin.body.pop("stream_options", None)
    for request in requests[1::2]:  # streams with and without a usage chunk
        if rng.random() < 0.6:
            request.body["stream"] = True
            if rng.random() < 0.8:
                request.body["stream_options"] = {"include_usage": True}
    invalid = [invalid_request(rng, reference, f"i{seed}-{i}") for i in range(3)]
    requests += boundary_requests(rng, reference, seed)
    gone = [leaving_request(rng, reference, f"g{seed}-{i}") for i in range(3)]
    gone[-1].body["stream"], gone[-1].expected_status = False, "499"
    mixed = requests + twins + invalid
    rng.shuffle(mixed)
    pressure = []
    for index in range(PRESSURE):
        prompt = [rng.randrange(6, 320) for _ in range(60)]
        body = {"model": SERVED_ID, "prompt": prompt, "max_tokens": 100, "temperature": 0,
                "logit_bias": {str(EOS_ID): -100}, "stream": index % 2 == 1}
        pressure.append(Request(f"p{seed}-{index}", "completions", body, prompts=[prompt],
                                continuations=[reference.greedy(prompt, 100, {EOS_ID: -100})]))
    return Round(seed, mixed, pressure, gone, cache_sequence(rng, reference, seed), seen_cases)


def waves(requests: list[Request], permits: int) -> list[list[Request]]:
    """`requests` in waves of at most `WAVE`, none holding more choices than the permits (no 429)."""
    out, wave = [], []
    for request in requests:
        size = request.n * len(request.prompts) if request.kind == "ok" else 0
        if wave and sum(r.n * len(r.prompts) for r in wave if r.kind == "ok") + size > permits:
            out.append(wave)
            wave = []
        wave.append(request)
        if len(wave) == WAVE:
            out.append(wave)
            wave = []
    return out + ([wave] if wave else [])


async def drive(served, app, run: Round, rng: random.Random) -> None:
    """Sends the round's requests: the mixed waves, the clients that leave, the cache sequence."""
    run.before = scrape(served)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                 timeout=WAIT_S) as client:
        for wave in waves(run.mixed, served.admission.limits.num_permits):
            await asyncio.gather(*(send(client, request) for request in wave))
            await idle(served, run.records, [r.key for r in wave if r.status == "200"])
        await asyncio.gather(*(send(client, request) for request in run.pressure))
        await idle(served, run.records, [r.key for r in run.pressure])
        for request in run.gone:
            await send_and_leave(app, request, rng.randint(2, 4))
        await idle(served, run.records, [r.key for r in run.gone])
        evicted = served.engine.scheduler.counters().pages_evicted
        run.cache_stats.append(served.stats())
        for request in run.cached_run:  # one at a time: each sees the pages the ones before committed
            await send(client, request)
            await idle(served, run.records, [request.key])
        run.cache_stats.append(served.stats())
        run.num_evictions = served.engine.scheduler.counters().pages_evicted - evicted
    run.after = scrape(served)


def run_round(runner, served, reference: Reference, seed: int, seen_cases: collections.Counter,
              is_roomy: bool = True) -> list[str]:
    """One seeded workload; every discrepancy with the ground truth (empty: none). On a server
    without room for every page (not `is_roomy`: requests are preempted and recomputed, pages
    evicted) the cache sequence's reuse and cached pages are not predicted."""
    rng = random.Random(seed)
    run = plan_round(rng, reference, seed, seen_cases)
    preemptions = served.engine.scheduler.counters().preemptions
    runner.run(drive(served, capturing(create_app(served), run.records), run, rng))
    seen_cases["preemptions" if is_roomy else "tight preemptions"] += (
        served.engine.scheduler.counters().preemptions - preemptions)
    seen_cases["speculative launches"] += delta(run.before, run.after, "helios_graph_launches_total",
                                                operation="speculative")
    for request in run.every:
        request.record = run.records.get(request.key)
        run.check(f"status of {request.key} {request.body}", request.status, request.expected_status)
    seen_cases.update(cases(run.ok, reference))
    seen_cases["too long"] += sum(r.kind == "too long" for r in run.every)
    check_usage(run, reference)
    check_cache(run, reference, served.engine.scheduler.cache.layout.page_tokens, is_roomy)
    check_metrics(run, reference)
    return run.problems


def check_usage(run: Round, reference: Reference) -> None:
    """Each response's usage, JSON and streamed alike, its finish reasons, observed ids and
    log-probability entries, and each access-log record, against the ground truth."""
    for request in run.ok:
        expected = request.expected_usage(reference)
        # a stream without include_usage has none, unless observed (its terminal chunk then has it)
        streamed_without_usage = (request.body.get("stream") and not request.body.get("stream_options")
                                  and not request.body.get("return_token_ids"))
        usage = request.usage
        run.check(f"usage of {request.key} {request.body}", usage and {key: usage[key] for key in expected},
                  None if streamed_without_usage else expected)
        if usage is not None and request.reused is not None and len(request.prompts) == 1:
            # the prompt once, as its first choice found the cache: the reuse the server reports
            run.check(f"cached tokens of {request.key}", usage["prompt_tokens_details"],
                      {"cached_tokens": request.reused})
        run.check(f"access-log tokens of {request.key}", request.record.totals(),
                  (expected["prompt_tokens"], expected["completion_tokens"]))
        if request.body.get("return_token_ids"):  # the first prompt's at the top, a batch's each on its choices
            run.check(f"prompt token ids of {request.key}", request.prompt_ids.get(-1), request.prompts[0])
            if len(request.prompts) > 1:
                run.check(f"prompt token ids of {request.key}'s choices",
                          [request.prompt_ids.get(index) for index in range(request.n * len(request.prompts))],
                          [ids for ids in request.prompts for _ in range(request.n)])
        if request.continuations is not None:
            check_outputs(run, request, reference)
    for request in run.gone:
        full = request.expected_usage(reference)
        prompt, output = request.record.totals()
        run.check(f"prompt tokens of {request.key} (left)", prompt, full["prompt_tokens"])
        if not 0 <= output <= full["completion_tokens"]:
            run.problems.append(f"seed {run.seed}: {request.key} (left) counts {output} output tokens of at most "
                                f"{full['completion_tokens']}")


def check_outputs(run: Round, request: Request, reference: Reference) -> None:
    """A greedy request's finish reasons, observed token ids (every token generated: EOS and the
    stop-crossing one included) and log-probability entries (one per token shown: every token
    generated but an EOS, where no stop hid any) against its continuations."""
    outcomes = request.choice_outcomes(reference)
    run.check(f"finish reasons of {request.key}", request.finishes,
              [{"eos": "stop"}.get(reason, reason) for _, reason in outcomes])
    if request.body.get("return_token_ids"):
        choices = [continuation for continuation in request.continuations for _ in range(request.n)]
        run.check(f"token ids of {request.key}", [request.token_ids[index] for index in range(len(outcomes))],
                  [continuation[:count] for continuation, (count, _) in zip(choices, outcomes)])
        run.seen_cases["token ids"] += 1
    if "logprobs" in request.body and all(reason != "stop" for _, reason in outcomes):
        run.check(f"log-probability entries of {request.key}",
                  [request.num_entries[index] for index in range(len(outcomes))],
                  [count - (reason == "eos") for count, reason in outcomes])
        run.seen_cases["logprobs"] += 1


def check_cache(run: Round, reference: Reference, page: int, is_roomy: bool) -> None:
    """The cache sequence's reuse by the rule (the response reports its first choice's; a later
    choice shares the first's prompt and computes only its last token, or, the first ended before
    it was admitted, reuses the first's cached pages), its lookups, and the cached pages it added:
    the distinct complete pages it committed, less the pages it evicted."""
    cached: set[tuple[int, ...]] = set()  # the sequence's committed pages (its prompts share with nothing before it)
    num_reused = 0  # the sequence's reused tokens, every choice's
    for request in run.cached_run if is_roomy else ():
        prompt = request.prompts[0]
        expected = expected_reuse(prompt, cached, page)
        run.check(f"reused prompt tokens of {request.key} (prompt of {len(prompt)})", request.reused, expected)
        num_reused += expected
        count = request.choice_outcomes(reference)[0][0]
        cached |= committed_pages(prompt + request.continuations[0][:count - 1], page)
        for choice in request.record.choices:
            shared = len(prompt) - 1
            run.seen_cases["choice on the first's prompt" if choice.num_reused_tokens == shared else
                           "choice from the cache"] += 1
            if choice.num_reused_tokens not in (shared, expected_reuse(prompt, cached, page)):
                run.problems.append(f"seed {run.seed}: a choice of {request.key} reused "
                                    f"{choice.num_reused_tokens} prompt tokens of {len(prompt)}")
            num_reused += choice.num_reused_tokens
    start, end = run.cache_stats
    run.check("prompt tokens the cache sequence looked up", end.prefix_lookup_tokens - start.prefix_lookup_tokens,
              sum(len(r.prompts[0]) * r.n for r in run.cached_run))
    if is_roomy:
        run.check("pages the cache sequence cached", end.pages_cached - start.pages_cached,
                  len(cached) - run.num_evictions)
        run.check("prompt tokens the cache sequence reused", end.prefix_reused_tokens - start.prefix_reused_tokens,
                  num_reused)


def check_metrics(run: Round, reference: Reference) -> None:
    """/metrics: the differences the workload made, against the ground truth (a client that left,
    as its access-log record counts it)."""
    before, after, ok, gone = run.before, run.after, run.ok, run.gone
    ran = ok + gone
    prompt_total = sum(r.record.totals()[0] for r in ran)
    output_total = sum(r.record.totals()[1] for r in ran)
    run.check("prompt tokens counter", delta(before, after, "helios_prompt_tokens_total"), prompt_total)
    run.check("generated tokens counter", delta(before, after, "helios_generated_tokens_total"), output_total)
    label = {"model_name": SERVED_ID}
    run.check("prompt-token histogram sum", delta(before, after, "helios_request_prompt_tokens_sum", **label),
              prompt_total)
    run.check("generation-token histogram sum",
              delta(before, after, "helios_request_generation_tokens_sum", **label), output_total)
    for name in ("helios_e2e_request_latency_seconds", "helios_request_queue_time_seconds",
                 "helios_request_prompt_tokens", "helios_request_generation_tokens"):
        run.check(f"{name} observations", delta(before, after, f"{name}_count", **label), len(ran))
    run.check("time-to-first-token observations",
              delta(before, after, "helios_time_to_first_token_seconds_count", **label),
              sum(r.record.totals()[1] > 0 for r in ran))
    reasons = collections.Counter()
    for request in ok:
        reasons.update(reason for _, reason in request.choice_outcomes(reference))
    for request in gone:
        reasons.update(r.finish_reason for r in (request.record, *request.record.choices))
    run.check("requests finished by reason", deltas_by(before, after, "helios_requests_finished_total", "reason"),
              {(reason,): count for reason, count in reasons.items()})
    # admitted: one per choice that ran (a choice cancelled before the scheduler took it is not)
    sure = sum(len(r.choice_outcomes(reference)) for r in ran if r.status == "200")
    admitted = delta(before, after, "helios_requests_admitted_total")
    if not sure <= admitted <= sure + sum(len(r.choice_outcomes(reference)) for r in gone if r.status == "499"):
        run.problems.append(f"seed {run.seed}: {admitted} requests admitted, {sure} choices ran")
    run.check("HTTP responses by endpoint and status",
              deltas_by(before, after, "helios_http_responses_total", "endpoint", "status"),
              dict(collections.Counter((r.endpoint, r.status) for r in run.every)))
    reused = sum(r.num_reused_tokens or 0 for request in ran for r in (request.record, *request.record.choices))
    run.check("prefix reused tokens counter", delta(before, after, "helios_prefix_reused_tokens_total"), reused)
    for name in ("helios_requests_active", "helios_requests_queued", "helios_admission_permits_in_use"):
        run.check(name, after[(name, ())], 0)
    run.check("pages free and cached",
              after[("helios_cache_pages_free", ())] + after[("helios_cache_pages_cached", ())],
              after[("helios_cache_pages", ())])


def cases(ok: list[Request], reference: Reference) -> collections.Counter:
    """How often the workload holds each case the ground truth distinguishes."""
    reasons = collections.Counter(reason for r in ok for _, reason in r.choice_outcomes(reference))
    found = {
        "eos": reasons["eos"], "stop": reasons["stop"], "length": reasons["length"],
        "stop token ids": sum("stop_token_ids" in r.body or "stop_token_sequences" in r.body for r in ok),
        "reasoning": sum(THINK_ID in (c or [])[:1] for r in ok for c in r.continuations or []),
        "echo": sum(bool(r.body.get("echo")) for r in ok),
        "max_tokens 0": sum(r.max_tokens == 0 for r in ok),
        "batch": sum(len(r.prompts) > 1 for r in ok), "n > 1": sum(r.n > 1 for r in ok),
        "sampled": sum(r.continuations is None for r in ok),
        "marker text": sum(TEXTS[-1] in json.dumps(r.body, ensure_ascii=False) for r in ok if r.endpoint == "chat"),
    }
    return collections.Counter(found)


def test_usage_and_metrics_equal_the_ground_truth(runner, served, reference):
    problems, seen_cases = [], collections.Counter()
    for seed in range(ROUNDS):
        problems += run_round(runner, served, reference, FIRST_SEED + seed, seen_cases)
    assert not problems, "\n".join(problems)
    print(f"cases over {ROUNDS} round(s): {dict(seen_cases)}")
    missing = [case for case in CASES if not seen_cases[case]]
    assert not missing, f"the workload has no {missing}: {seen_cases}"


def test_usage_is_the_ground_truth_under_preemption(runner, tight, reference):
    """The same workloads where pages run short: requests are preempted, recomputed and their
    pages evicted, and usage and /metrics still say what the ground truth says."""
    problems, seen_cases = [], collections.Counter()
    for seed in range(ROUNDS):
        problems += run_round(runner, tight, reference, FIRST_SEED + 7919 + seed, seen_cases, is_roomy=False)
    assert not problems, "\n".join(problems)
    print(f"cases over {ROUNDS} round(s), pages short: {dict(seen_cases)}")
    assert seen_cases["tight preemptions"], "no request was preempted"
