"""Batched prompts and ``n`` choices equal the same requests sent one by one (a differential test).

Seeded draws of ``/v1/completions`` requests over a tiny served core (the tiny chat core's
checkpoint prepared with scored prefill and a 64-token context): a text, a token-id list or a batch
of either (duplicates included, so prompts share pages through the prefix cache; token ids at both
edges of the input vocabulary), ``n`` up to 3, greedy or seeded sampling (a seed near 2**63, whose
choices' seeds wrap), ``echo``, ``logprobs``, ``prompt_logprobs``, ``stop`` strings, ``max_tokens``
null (what the context leaves each prompt) or 0 with echo, ``logit_bias``, ``return_token_ids``.
Each draw is sent whole, as JSON and as a stream, and again as one request per (prompt ``i``,
choice ``j``) with that prompt alone, ``n`` 1 and the seed plus ``j``: choice ``i * n + j`` of
the batch must equal that single request's choice (text, finish reason, token ids, the choice's
prompt ids, log-probabilities with their ``text_offset``, which index each choice's own text as a
single request's do, and prompt scores; values within float noise, as the batch decodes the
choices in rows a single request does not share). The stream is reassembled per index: every index
appears, each finishes exactly once on its last chunk, one response id, and the usage chunk (last,
``choices: []``) equals the JSON body's, which is the singles' sum (each prompt counted once).

Beside the draws: a batch whose prompt ``i`` cannot be served (longer than the context, empty, an
id past the vocabulary, a ``max_tokens`` it leaves no room for) is a 400 naming ``prompt[i]``,
streamed or not, with nothing left running; a client that leaves a batched stream releases every
prompt's engine requests (pages, slots, permits); the chat endpoint's ``n`` choices equal single
requests with seed + j.

``HELIOS_BATCHED_DRAWS`` sets the number of draws (default `NUM_DRAWS`), for longer runs outside
the suite; ``HELIOS_BATCHED_DRAW_SWEEP=1`` doubles the default.
"""

from __future__ import annotations

import asyncio
import json
import os
import random

import httpx
import pytest

from helios.server.app import create_app
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID, TinyCore, tiny_core
from support.sweeps import swept
from test_choice_stream import stream as raw_stream  # tests/server is on sys.path (no package)
from test_slow_reader import eventually

# 12 draws by default: each field above (batches of texts and of ids, n > 1, greedy and seeded, the wrapping seed,
# echo, max_tokens null and 0, logprobs, prompt_logprobs, stops, logit_bias, token ids, include_usage) is drawn at
# least once among them; HELIOS_BATCHED_DRAW_SWEEP=1 draws 24 (more seeds reach rarer combinations of the same paths).
NUM_DRAWS = int(os.environ.get("HELIOS_BATCHED_DRAWS", "24" if swept("HELIOS_BATCHED_DRAW_SWEEP") else "12"))
FIRST_DRAW = int(os.environ.get("HELIOS_BATCHED_FIRST_DRAW", "0"))
CONTEXT_TOKENS = 64
QUEUE_CAPACITY = 16
TOLERANCE = 2e-4
# 2 to 48 tokens: the longest take two prefill steps and leave 16 tokens of context for the output
TEXTS = ("hello", "the quick brown fox", "ab", "what is 12 plus 30? it is", " two  spaces\nand a line", "é ü 日本",
         "the quick brown fox jumps over the lazy dog, and then it naps until noon")
STOPS = ("e", "o", " t", "the", "\n")
SEED_EDGE = 2**63 - 2  # choice 2 of a request with this seed samples with -2**63


def _scored_core(base) -> TinyCore:
    from helios.ignition.export import CapacityPlan

    # one decode batch (8 rows: a batch's choices decode together; a single request's one row is padded), so fewer
    # programs to prepare: the batch and its single requests decode in one program
    return tiny_core(base, "helios-batched-core", CapacityPlan(context_tokens=CONTEXT_TOKENS, prefill_tokens=32,
                                                               decode_batches=(8,), scored_prefill=True))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from helios.core.reader import open_core
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel

    core = _scored_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=QUEUE_CAPACITY))
    served = ServedModel.from_runtime(runtime, queue_capacity=QUEUE_CAPACITY, frontend_workers=2,
                                      owned_by=core.namespace)
    served.start()
    yield served
    served.shutdown()


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


@pytest.fixture(scope="module")
def input_range(served) -> tuple[int, int]:
    return served.frontend._facts.input_range


# -- requests ------------------------------------------------------------------------------------


async def post(app, body: dict, path: str = "/v1/completions") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as http:
        content = json.dumps({"model": SERVED_ID, **body}).encode()  # ASCII: a lone surrogate as its escape
        return await http.post(path, content=content, headers={"content-type": "application/json"})


async def post_ok(app, body: dict, path: str = "/v1/completions") -> dict:
    response = await post(app, body, path)
    assert response.status_code == 200, (body, response.text)
    return response.json()


async def post_stream(app, body: dict, path: str = "/v1/completions") -> list[dict]:
    """The stream's chunks; its framing checked (data events, ``[DONE]`` last)."""
    response = await post(app, {**body, "stream": True}, path)
    assert response.status_code == 200, (body, response.text)
    events = [block for block in response.text.split("\n\n") if block]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: {") for e in events[:-1]), response.text
    return [json.loads(event[6:]) for event in events[:-1]]


def signed(seed: int) -> int:
    return (seed + 2**63) % 2**64 - 2**63


def single_bodies(body: dict) -> list[list[dict]]:
    """The single requests of `body`: [prompt i][choice j], each with prompt i alone, n 1, seed + j."""
    prompts = body["prompt"] if isinstance(body["prompt"], list) and isinstance(body["prompt"][0], (str, list)) \
        else [body["prompt"]]
    n = body.get("n") or 1
    out = []
    for prompt in prompts:
        row = []
        for j in range(n):
            one = {key: value for key, value in body.items() if key not in ("n", "stream", "stream_options")}
            one["prompt"] = prompt
            if body.get("seed") is not None:
                one["seed"] = signed(body["seed"] + j)
            row.append(one)
        out.append(row)
    return out


# -- draws ---------------------------------------------------------------------------------------


def draw(seed: int, input_range: tuple[int, int]) -> dict:
    rng = random.Random(seed)
    begin, end = input_range
    num_prompts = rng.choice((1, 2, 3, 4))
    if rng.random() < 0.6:
        pool = rng.sample(TEXTS, 3)
    else:
        edges = (begin, end - 1)
        pool = [[rng.choice(edges) if rng.random() < 0.3 else rng.randrange(begin, end)
                 for _ in range(rng.choice((rng.randint(1, 12), rng.randint(33, 48))))] for _ in range(3)]
    prompts = [rng.choice(pool) for _ in range(num_prompts)]  # duplicates share prompt pages
    n = rng.choice((1, 1, 2, 3))
    is_batch = num_prompts > 1 or rng.random() < 0.5
    body = {"prompt": prompts if is_batch else prompts[0], "n": n}
    if rng.random() < 0.35:
        body["temperature"] = 0.0
        if rng.random() < 0.3:
            body["seed"] = rng.randrange(2**31)
    else:
        body["temperature"] = rng.choice((0.7, 1.0, 1.5))
        body["seed"] = SEED_EDGE if rng.random() < 0.15 else rng.randrange(-2**31, 2**31)
    body["max_tokens"] = rng.choice((None, 1, 3, 8, 16))
    if rng.random() < 0.3:
        body["echo"] = True
        if rng.random() < 0.3:
            body["max_tokens"] = 0
    if rng.random() < 0.4:
        body["logprobs"] = rng.choice((0, 2))
    if rng.random() < 0.15:
        body["prompt_logprobs"] = rng.choice((0, 1))
    if rng.random() < 0.3 and body["max_tokens"] != 0:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    if rng.random() < 0.2:
        body["logit_bias"] = {str(rng.randrange(begin, end)): rng.choice((-100.0, 4.0, 8.0)) for _ in range(2)}
    if rng.random() < 0.3:
        body["return_token_ids"] = True
    if rng.random() < 0.6:
        body["stream_options"] = {"include_usage": True}
    return body


# -- comparison ----------------------------------------------------------------------------------


def assert_close(got, want, where: str) -> None:
    """Equal JSON values, numbers (log-probabilities) within `TOLERANCE`."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert abs(got - want) <= TOLERANCE, (where, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, got, want)
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for index, (a, b) in enumerate(zip(got, want)):
            assert_close(a, b, f"{where}[{index}]")
    else:
        assert got == want, (where, got, want)


def expected_choices(body: dict, singles: list[list[dict]]) -> list[dict]:
    """Choice ``i * n + j`` as single request (i, j) answered it, with the batch's fields: its
    ``index``, and for a batch of several prompts its own prompt's ids on the choice."""
    out = []
    is_batch = len(singles) > 1
    for row in singles:
        for single in row:
            choice = dict(single["choices"][0], index=len(out))
            if is_batch and "prompt_token_ids" in single:
                choice["prompt_token_ids"] = single["prompt_token_ids"]
            out.append(choice)
    return out


def expected_usage(singles: list[list[dict]]) -> dict:
    prompt_tokens = sum(row[0]["usage"]["prompt_tokens"] for row in singles)
    completion_tokens = sum(single["usage"]["completion_tokens"] for row in singles for single in row)
    reasoning_tokens = sum(single["usage"]["completion_tokens_details"]["reasoning_tokens"]
                           for row in singles for single in row)
    # no prompt_tokens_details: a prompt's cached tokens depend on what ran before it
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}


def reassembled(chunks: list[dict], num_choices: int, include_usage: bool) -> tuple[list[dict], dict | None]:
    """Each index's choice as a client accumulates it (text, token ids, log-probabilities, prompt
    scores, finish reason); the stream's framing per index checked."""
    assert len({chunk["id"] for chunk in chunks}) == 1
    usage_chunks = [chunk for chunk in chunks if not chunk["choices"]]
    if include_usage:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0]
    else:
        assert not usage_chunks
    states: dict[int, dict] = {}
    for chunk in chunks:
        assert len(chunk["choices"]) <= 1
        for entry in chunk["choices"]:
            state = states.setdefault(entry["index"], {"index": entry["index"], "text": "", "finish_reason": None})
            assert state["finish_reason"] is None, f"choice {entry['index']} continues after its finish"
            state["text"] += entry["text"]
            state["finish_reason"] = entry["finish_reason"]
            if entry.get("logprobs") is not None:
                merged = state["logprobs"] = state.get("logprobs") or {}
                for key, values in entry["logprobs"].items():
                    merged.setdefault(key, []).extend(values)
            elif "logprobs" not in state:
                state["logprobs"] = None
            for key in ("token_ids", "prompt_logprobs"):
                if key in entry:
                    state.setdefault(key, []).extend(entry[key])
            if "prompt_token_ids" in entry:
                state["prompt_token_ids"] = entry["prompt_token_ids"]
    assert sorted(states) == list(range(num_choices))
    assert all(state["finish_reason"] is not None for state in states.values())
    return [states[index] for index in range(num_choices)], (usage_chunks[0]["usage"] if usage_chunks else None)


def streamed_single(chunks: list[dict]) -> dict:
    """A single request's stream as its JSON choice reads."""
    return reassembled(chunks, 1, any(not chunk["choices"] for chunk in chunks))[0][0]


def comparable(choice: dict) -> dict:
    """A choice's fields a stream and a JSON body both carry (an empty ``logprobs`` object, which a
    stream with no listed token sends, reads as the JSON body's lists)."""
    out = {key: choice[key] for key in ("index", "text", "finish_reason", "token_ids", "prompt_token_ids",
                                        "prompt_logprobs") if key in choice}
    logprobs = choice.get("logprobs")
    if logprobs is not None:
        out["logprobs"] = {key: logprobs.get(key, []) for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                  "text_offset")}
    return out


async def check_draw(app, body: dict) -> None:
    singles = [await asyncio.gather(*(post_ok(app, one) for one in row)) for row in single_bodies(body)]
    want = expected_choices(body, singles)
    usage = expected_usage(singles)

    response = await post_ok(app, {key: value for key, value in body.items() if key != "stream_options"})
    assert [c["index"] for c in response["choices"]] == list(range(len(want)))
    for got, expected in zip(response["choices"], want):
        assert_close(got, expected, f"choice {expected['index']}")
    assert {key: response["usage"][key] for key in usage} == usage
    if body.get("return_token_ids"):
        assert response["prompt_token_ids"] == singles[0][0]["prompt_token_ids"]

    include_usage = bool(body.get("stream_options"))
    chunks = await post_stream(app, body)
    got, streamed_usage = reassembled(chunks, len(want), include_usage)
    for choice, expected in zip(got, want):
        assert_close(comparable(choice), comparable(expected), f"streamed choice {expected['index']}")
    if include_usage:
        assert {key: streamed_usage[key] for key in usage} == usage


def assert_all_agree(runner, label: str, bodies: dict, check) -> None:
    """Runs `check(body)` for every drawn body; fails listing every draw that differs, so that a
    sweep outside the suite counts them all."""
    failures = []
    for seed, body in bodies.items():
        try:
            runner.run(check(body))
        except AssertionError as error:
            failures.append(f"{label} {seed}: {json.dumps(body)}: {str(error)[:300]}")
    assert not failures, f"{len(failures)} of {len(bodies)} {label}s differ:\n" + "\n".join(failures)


def test_batched_prompts_and_choices_equal_single_requests(runner, app, served, input_range):
    bodies = {seed: draw(seed, input_range) for seed in range(FIRST_DRAW, FIRST_DRAW + NUM_DRAWS)}
    assert_all_agree(runner, "draw", bodies, lambda body: check_draw(app, body))
    runner.run(eventually(lambda: served.admission.in_use == 0))


def test_choice_seeds_wrap_past_the_signed_range(runner, app, input_range):
    """Choice 2 of seed 2**63 - 2 samples with -2**63 (the wrapped seed + 2), as a single request
    with that seed does; duplicate prompts answer alike."""
    body = {"prompt": ["hello", "hello"], "n": 3, "seed": SEED_EDGE, "temperature": 1.0, "max_tokens": 6,
            "logprobs": 1, "stream_options": {"include_usage": True}}
    runner.run(check_draw(app, body))


# -- prompts a batch cannot serve ----------------------------------------------------------------


def metric_values(runner, app) -> dict[str, float]:
    async def get():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return (await http.get("/metrics")).text
    values = {}
    for line in runner.run(get()).splitlines():
        if line.startswith("helios_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def assert_idle(runner, app, served) -> None:
    """Nothing running: every permit back, no request in a slot or queued, every page free or cached."""
    runner.run(eventually(lambda: served.admission.in_use == 0
                          and served.engine.scheduler.counters().num_running == 0))
    values = metric_values(runner, app)
    assert values["helios_admission_permits_in_use"] == 0
    assert values["helios_requests_active"] == 0 and values["helios_requests_queued"] == 0
    assert values["helios_cache_pages_free"] + values["helios_cache_pages_cached"] == values["helios_cache_pages"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_with_a_prompt_it_cannot_serve_is_a_400_naming_that_prompt(runner, app, served, input_range, stream):
    begin, end = input_range
    long_text = "x " * CONTEXT_TOKENS
    cases = [
        ({"prompt": ["hello", long_text, "ab"]}, "prompt[1]", "no room for output"),
        ({"prompt": [[5, 6], [7], [9] * CONTEXT_TOKENS]}, "prompt[2]", "no room for output"),
        ({"prompt": [long_text, "hello"], "n": 2}, "prompt[0]", "no room for output"),
        ({"prompt": ["hello", "x" * 5000]}, "prompt[1]", "characters"),
        ({"prompt": ["hello", ""]}, "prompt[1]", "empty"),
        ({"prompt": [[begin, end - 1], [end - 1, end]]}, "prompt[1]", f"[{begin}, {end})"),
        ({"prompt": [[5], [6] * (CONTEXT_TOKENS - 4)], "max_tokens": 8}, "max_tokens", "prompt[1]"),
    ]
    for body, param, words in cases:
        body = {"max_tokens": 4, **body, "stream": stream}
        response = runner.run(post(app, body))
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], (body, error)
    assert_idle(runner, app, served)


def test_a_single_prompt_names_the_prompt_field(runner, app):
    """Without a batch, the field at fault is ``prompt`` itself (``n`` choices included)."""
    for body in ({"prompt": ""}, {"prompt": "", "n": 2}, {"prompt": ["x " * CONTEXT_TOKENS]}):
        response = runner.run(post(app, body))
        assert response.status_code == 400
        expected = "prompt[0]" if isinstance(body["prompt"], list) else "prompt"
        assert response.json()["error"]["param"] == expected, response.text


def test_a_client_leaving_a_batched_stream_frees_every_prompts_requests(runner, app, served):
    payload = {"model": SERVED_ID, "prompt": ["hello", "the quick brown fox", "hello"], "n": 2, "max_tokens": None,
               "temperature": 0}
    messages = runner.run(raw_stream(app, payload, disconnect_after=3))
    assert not any(m.get("more_body") is False for _, m in messages)  # no end: the client is gone
    assert b'"index":' in b"".join(m.get("body", b"") for _, m in messages)  # it left mid-stream
    assert_idle(runner, app, served)


def reused_tokens(runner, app) -> float:
    return metric_values(runner, app)["helios_prefix_reused_tokens_total"]


def test_repeated_prompts_of_a_batch_share_the_prompt_pages(runner, app, served):
    """A prompt repeated in a batch is computed once: the repeats reuse all of it but its last token
    (a prompt group, as ``n`` choices form one), and answer as the first does."""
    prompt = "a prompt that no other test sends"
    before = reused_tokens(runner, app)
    response = runner.run(post_ok(app, {"prompt": [prompt, "ab", prompt, prompt], "max_tokens": 5, "temperature": 0}))
    tokenizer = served.frontend._tokenizer
    num_prompt, num_other = (len(tokenizer.encode(text, add_special_tokens=True).ids) for text in (prompt, "ab"))
    assert reused_tokens(runner, app) - before == 2 * (num_prompt - 1)
    texts = [choice["text"] for choice in response["choices"]]
    assert texts[0] == texts[2] == texts[3]
    assert response["usage"]["prompt_tokens"] == 3 * num_prompt + num_other  # each prompt of the batch counted


def test_a_client_leaving_a_batched_json_request_frees_every_prompts_requests(runner, app, served):
    body = json.dumps({"model": SERVED_ID, "prompt": [[5, 6, 7], [8] * 40, [5, 6, 7]], "n": 2,
                       "temperature": 0}).encode()
    path = "/v1/completions"
    scope = post_scope(path, body)
    requested = asyncio.Event()

    async def receive():
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await eventually(lambda: served.engine.scheduler.counters().num_running > 0)
        return {"type": "http.disconnect"}

    async def send(_message):
        pass

    runner.run(asyncio.wait_for(app(scope, receive, send), 60))
    assert_idle(runner, app, served)


# -- chat ----------------------------------------------------------------------------------------


MESSAGES = ([{"role": "user", "content": "hello"}],
            [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "what is 12 plus 30?"}])
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}
SPECIALS = ("<think>", "</think>", "<tool_call>", "<|im_end|>")


def draw_chat(seed: int, special_ids: dict) -> dict:
    rng = random.Random(seed)
    body = {"messages": rng.choice(MESSAGES), "n": rng.choice((2, 3)), "max_tokens": rng.choice((4, 12, None)),
            "seed": rng.randrange(2**31), "temperature": rng.choice((0.0, 1.0))}
    if rng.random() < 0.5:
        body["logprobs"] = True
        body["top_logprobs"] = rng.choice((0, 1))
    shape = rng.random()
    if shape < 0.2:
        body["response_format"] = {"type": "json_object"}
    elif shape < 0.45:
        body["tools"] = [WEATHER]
        body["tool_choice"] = rng.choice(("auto", "required"))
        body["max_tokens"] = None  # what the 64-token context leaves after the tool declarations
    elif shape < 0.7:
        body["stop"] = rng.sample(STOPS, 1)
    if rng.random() < 0.4:
        body["logit_bias"] = {str(special_ids[text]): 5.0 for text in rng.sample(SPECIALS, 2)}
    if rng.random() < 0.6:
        body["stream_options"] = {"include_usage": True}
    return body


def chat_choice(choice: dict) -> dict:
    """A chat choice without its tool calls' ids (drawn fresh for every request)."""
    message = dict(choice["message"])
    if message.get("tool_calls"):
        message["tool_calls"] = [{key: value for key, value in call.items() if key != "id"}
                                 for call in message["tool_calls"]]
    return {"index": choice["index"], "message": message, "finish_reason": choice["finish_reason"],
            "logprobs": choice.get("logprobs")}


def chat_streamed(chunks: list[dict], num_choices: int) -> list[dict]:
    states: dict[int, dict] = {}
    for chunk in chunks:
        for entry in chunk["choices"]:
            state = states.setdefault(entry["index"], {"content": "", "reasoning_content": "", "calls": {},
                                                       "finish": []})
            delta = entry["delta"]
            for key in ("content", "reasoning_content"):
                state[key] += delta.get(key) or ""
            for call in delta.get("tool_calls") or ():
                known = state["calls"].setdefault(call["index"], {"type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
                for key in ("name", "arguments"):
                    known["function"][key] += call.get("function", {}).get(key) or ""
            if entry["finish_reason"] is not None:
                state["finish"].append(entry["finish_reason"])
    assert sorted(states) == list(range(num_choices))
    return [states[index] for index in range(num_choices)]


NUM_CHAT_DRAWS = int(os.environ.get("HELIOS_BATCHED_CHAT_DRAWS", "6"))


def test_chat_choices_equal_single_requests_with_seed_plus_j(runner, app, served):
    tokenizer = served.frontend._tokenizer
    special_ids = {text: tokenizer.token_to_id(text) for text in SPECIALS}
    bodies = {seed: draw_chat(seed, special_ids) for seed in range(NUM_CHAT_DRAWS)}
    assert_all_agree(runner, "chat draw", bodies, lambda body: check_chat_draw(app, body))


async def check_chat_draw(app, body: dict) -> None:
    path, n = "/v1/chat/completions", body["n"]
    single_body = {key: value for key, value in body.items() if key not in ("n", "stream_options")}
    singles = await asyncio.gather(*(post_ok(app, {**single_body, "seed": body["seed"] + j}, path) for j in range(n)))
    response = await post_ok(app, single_body | {"n": n}, path)
    want = [chat_choice(dict(single["choices"][0], index=j)) for j, single in enumerate(singles)]
    assert_close([chat_choice(choice) for choice in response["choices"]], want, "chat")
    usage = {"prompt_tokens": singles[0]["usage"]["prompt_tokens"],
             "completion_tokens": sum(s["usage"]["completion_tokens"] for s in singles)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    assert {key: response["usage"][key] for key in usage} == usage
    chunks = await post_stream(app, body, path)
    for state, choice in zip(chat_streamed(chunks, n), want):
        message = choice["message"]
        assert state["content"] == (message["content"] or "")
        assert state["reasoning_content"] == (message.get("reasoning_content") or "")
        assert [state["calls"][k] for k in sorted(state["calls"])] == (message.get("tool_calls") or [])
        assert state["finish"] == [choice["finish_reason"]]
    if body.get("stream_options"):
        assert {key: chunks[-1]["usage"][key] for key in usage} == usage
