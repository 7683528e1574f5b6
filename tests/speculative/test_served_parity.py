"""Speculation served over HTTP answers what the same core answers without it (a differential test).

One tiny chat core (the server tests' Qwen3-shaped checkpoint with the test tokenizer and chat
template, prepared with a one-layer truncated copy of itself as the draft: speculative widths 1
and 4, so D = 3 proposals a round; the draft agrees about one time in three: rounds both accept
drafted runs and reject them; prefixes allocated on the device, ceilings of 4 a lane within P = 2
a lane, and MIXED steps: test_prepared_core.py's core, `support.allocating_core`, prepared once a
run) is served twice in this process: speculating with the learned draft ("learned") and
`--speculative-width 1` (the documented switch that turns speculation off: the reference); with
HELIOS_SPECULATIVE_SWEEP=1 also with history drafting too ("history"), with a scheduler that never
picks speculative programs ("decode": plain DECODE steps) and the same weights prepared without
prefix allocation or MIXED steps ("unallocated", prepared by this module).

Every greedy request below goes to the learned server alone (the history server too with
HELIOS_SPECULATIVE_SWEEP=1), as JSON or as a stream (in turn over the cases; the other way in the
run of all at once below; both ways with HELIOS_SPECULATIVE_SWEEP=1), and must come back as the
reference answers it (each case's JSON and stream asked together): text, token ids, finish reason,
usage, log-probabilities (float32 noise allowed), tool calls (their random ids aside), prompt
scores and echoed prompts. The fields: max_tokens 1 to D + 3 around
the draft's boundaries, EOS inside a round, stop strings inside a repeated run, stop_token_ids and
stop_token_sequences on a token the draft proposes, n > 1, logprobs and top_logprobs, echo,
prompt_logprobs, json_schema output, tools with tool_choice required and named, logit_bias on a
drafted token, presence/frequency/repetition penalties on outputs that repeat (a drafted token must
see the penalties of the tokens accepted before it). Then all of them at once on every server but
the reference, each case the way it was not asked alone (speculating lanes beside lanes that
cannot draft in one round, beside requests that keep every step plain, and on "learned" in rounds
trimmed to P and in MIXED steps). HELIOS_SPECULATIVE_SWEEP=1 sends every case both ways alone and
there, and adds the cases whose paths default cases take (`_SWEPT_CASES`).

Sampling (temperature 1): verification is rejection sampling, whose tokens depend on where a
lane's rounds fall, so speculating sampled output is compared by distribution with the target's
exact one (as test_distribution.py does at the program level; requests without a seed, their fresh
seeds drawn from a fixed sequence here). A request with a chosen seed never speculates (README: the
same seed gives the same tokens): it answers the same alone and beside requests that change the
rounds, and n seeded choices equal single requests with their seeds, on every server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json

import httpx
import pytest
import torch
import transformers

from helios.contract import StartupOptions
from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.loading.model import LoadOptions
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.sweeps import in_sweep, swept

from .support import ALLOCATING_NAMESPACE, ALLOCATING_SERVED_ID, Counting, allocating_core

NAMESPACE = "test.helios/served-speculation"
SERVED_ID = "tiny-chat"
QUEUE = 16  # permits for n = 16 beside max-active 4
REFERENCE = "width-1"
# "history" (history drafting beside the learned draft) is started only with HELIOS_SPECULATIVE_SWEEP=1 (for the
# suite's time): it drafts as "learned" does and copies candidates besides; by default test_prepared_core's
# test_startup_selects_width_and_history_drafting generates with history drafting on this checkpoint's captured
# speculative core (tokens equal to transformers', drafts accepted), and test_equivalence's
# test_history_drafting_copies_candidates_and_keeps_the_output checks that copies are accepted and keep the output.
SPECULATING = in_sweep("HELIOS_SPECULATIVE_SWEEP", ("learned",), ("history",))
# The servers each case is asked of alone, and seeded requests' servers.
ALONE = SPECULATING
# "decode" (a speculative core whose scheduler never speculates) is started only in that sweep too: the other servers
# take plain steps on the same core for requests that cannot draft, and test_equivalence decodes ordinarily on
# speculative cores.
PLAIN = in_sweep("HELIOS_SPECULATIVE_SWEEP", (), ("decode",))
UNALLOCATED = "unallocated"  # the same weights prepared without device prefix allocation or MIXED steps
# "unallocated" is started only with HELIOS_SPECULATIVE_SWEEP=1 too (for the suite's time, its core is prepared then
# only): its lanes verify whole rounds and decode beside no prompt; by default test_deepseek_core generates on a
# captured core that speculates so (tokens equal to plain decoding and transformers'), test_example_core_server serves
# one over HTTP, and test_equivalence decodes speculatively without allocation for every attention path; the served
# path it would take is "learned"'s.
ALLOCATED = in_sweep("HELIOS_SPECULATIVE_SWEEP", (), (UNALLOCATED,))
WIDTH, DRAFTS = 4, 3
# A prompt whose greedy output repeats one token (298, "ld") many times: stops, penalties and a
# bias on that token all act inside runs the draft proposes.
REPEATING = "the quick brown fox"
REPEATED_TOKEN = 298
# Token-id prompts whose greedy outputs end at EOS (<|im_end|>) after 34, 20 and 35 tokens: inside
# a round, and at a round's last position.
EOS_PROMPTS = ([301, 130, 155, 101], [102, 23, 140], [287, 73, 157, 65, 251])


@dataclasses.dataclass
class Server:
    served: ServedModel
    counting: Counting
    client: httpx.AsyncClient
    mixed_rounds: list  # speculative rounds with lanes that draft beside lanes that cannot (ceiling 1)


def count_mixed_rounds(executor, into: list) -> None:
    finish = executor.finish

    def counted(launched):
        ceilings = {row.token_ceiling > 1 for row in launched.plan.rows}
        if launched.plan.operation.name == "SPECULATIVE" and ceilings == {True, False}:
            into.append(launched.plan.sequence)
        return finish(launched)

    executor.finish = counted


def prepare(checkpoint, root, key: SigningKey, speculative: SpeculativePlan):
    plan = CapacityPlan(context_tokens=256, prefill_tokens=32, decode_batches=(4,), mixed=False, scored_prefill=True,
                        speculative=speculative)
    prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))


@pytest.fixture(scope="module")
def checkpoint_and_core(tmp_path_factory):
    """The checkpoint, its draft and the allocating core (test_prepared_core's, prepared once a run)."""
    made = allocating_core(tmp_path_factory)
    return made.checkpoint, made.draft, made


def unallocated_core(tmp_path_factory, checkpoint, draft) -> tuple:
    """The same weights prepared without prefix allocation or MIXED steps (HELIOS_SPECULATIVE_SWEEP=1 only)."""
    root = tmp_path_factory.mktemp("served-speculation")
    key = SigningKey.generate()
    write_key_pair(root / "publisher.key", key, [NAMESPACE])
    prepare(checkpoint, root, key, SpeculativePlan(draft, widths=(1, WIDTH)))
    return root / "model.core", root / "publisher.key.pub", NAMESPACE


def start_server(core, startup: StartupOptions, policy: SchedulerPolicy = SchedulerPolicy(), public_key=None,
                 accept: str = NAMESPACE) -> Server:
    opened = open_core(core, accept=accept, trusted_keys=[public_key])
    options = RuntimeOptions(load=LoadOptions(startup=startup), queue_capacity=QUEUE, policy=policy)
    runtime = build_runtime(opened, options)
    counting, mixed_rounds = Counting(), []
    counting.wrap(runtime.engine.executor)
    count_mixed_rounds(runtime.engine.executor, mixed_rounds)
    served = ServedModel.from_runtime(runtime, queue_capacity=QUEUE, frontend_workers=2)
    served.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)), base_url="http://test",
                               timeout=120)
    return Server(served, counting, client, mixed_rounds)


@pytest.fixture(scope="module")
def runner():
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def servers(checkpoint_and_core, tmp_path_factory):
    checkpoint, draft, allocating = checkpoint_and_core
    # device prefix allocation (ceilings of 4 a lane within P = 2 a lane: a lane's length depends on
    # the others' confidence) and MIXED steps (decoding lanes take one plain token beside a prompt)
    assert ALLOCATING_SERVED_ID == SERVED_ID
    here = (allocating.core, allocating.public_key, ALLOCATING_NAMESPACE)
    configurations = {
        "learned": (here, StartupOptions(), SchedulerPolicy()),
        **({"history": (here, StartupOptions(history_drafting=True), SchedulerPolicy())}
           if "history" in SPECULATING else {}),
        REFERENCE: (here, StartupOptions(speculative_width=1), SchedulerPolicy()),
        **({"decode": (here, StartupOptions(), SchedulerPolicy(speculative=False))} if PLAIN else {}),
        **({UNALLOCATED: (unallocated_core(tmp_path_factory, checkpoint, draft), StartupOptions(),
                          SchedulerPolicy())} if ALLOCATED else {}),
    }
    started = {}
    try:
        for name, ((core, public_key, accept), startup, policy) in configurations.items():
            started[name] = start_server(core, startup, policy, public_key, accept)
        yield started
    finally:
        for server in started.values():
            server.served.shutdown()


def test_the_servers_select_the_widths_they_were_started_with(servers):
    widths = {name: {p.speculative.verify_tokens for p in server.served.engine.executor.model.programs
                     if p.speculative is not None} for name, server in servers.items()}
    assert widths == {**{name: {WIDTH} for name in (*SPECULATING, *ALLOCATED, *PLAIN)}, REFERENCE: {1}}


# -- the requests ---------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "integer", "minimum": 0, "maximum": 23}}, "required": ["zone"]}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}
HELLO = [{"role": "user", "content": "hello"}]


def text(prompt, max_tokens: int, **fields) -> dict:
    return {"model": SERVED_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **fields}


def chat(messages, max_tokens: int, **fields) -> dict:
    return {"model": SERVED_ID, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **fields}


# name -> (body, speculates: the learned server accepts drafted tokens while serving it)
CASES = {
    **{f"max_tokens_{limit}": (text(REPEATING, limit), limit > 2) for limit in range(1, DRAFTS + 4)},
    **{f"max_tokens_{limit}_of_hello": (chat(HELLO, limit), limit > 3) for limit in (2, 4, 5)},
    **{f"eos_after_{index}": (text(prompt, 40), True) for index, prompt in enumerate(EOS_PROMPTS)},
    "echo_only": (text("hello world", 0, echo=True), False),
    "prompt_logprobs_only": (text("hello world", 0, prompt_logprobs=1), False),
    "repeating": (text(REPEATING, 40), True),
    "chat": (chat(HELLO, 40), True),
    "chat_system": (chat([{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": "what is 12 plus 30?"}], 40), True),
    "stop_inside_a_repeated_run": (text(REPEATING, 40, stop=["ldld"]), False),
    "stop_late": (text(REPEATING, 60, stop=["am"]), False),
    "stop_token_ids": (text(REPEATING, 40, stop_token_ids=[REPEATED_TOKEN]), False),
    "stop_token_sequences": (text(REPEATING, 40, stop_token_sequences=[[REPEATED_TOKEN, REPEATED_TOKEN]]), False),
    "n_3": (text("hello world", 30, n=3), True),
    "n_2_chat": (chat(HELLO, 30, n=2), True),
    "batch_of_prompts": (text(["hello world", REPEATING], 30, n=2), True),
    # log-probabilities speculate too (the SPECULATIVE programs' token-logprobs twins)
    "logprobs": (text(REPEATING, 24, logprobs=3), True),
    "logprobs_echo": (text("hello world", 12, logprobs=2, echo=True), True),
    "chat_top_logprobs": (chat(HELLO, 24, logprobs=True, top_logprobs=3), True),
    "echo": (text("hello world", 24, echo=True), True),
    "prompt_logprobs": (text("hello world", 24, prompt_logprobs=2), True),
    "chat_prompt_logprobs": (chat(HELLO, 24, prompt_logprobs=1), True),
    "json_schema": (chat(HELLO, 40, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}), False),
    "json_object": (chat(HELLO, 40, response_format={"type": "json_object"}), False),
    # forced calls get room to close (the byte-level tiny model spells one in about 70 tokens): a call the
    # output limit cuts is returned as content (`helios.frontend.parsers.tag_tools`), not as a call
    "tools_required": (chat([{"role": "user", "content": "weather?"}], 160, tools=[WEATHER, CLOCK],
                            tool_choice="required"), False),
    "tools_named": (chat([{"role": "user", "content": "time?"}], 160, tools=[WEATHER, CLOCK],
                         tool_choice={"type": "function", "function": {"name": "get_time"}}), False),
    "tools_auto": (chat([{"role": "user", "content": "weather?"}], 40, tools=[WEATHER]), True),
    "logit_bias_bans_the_drafted_token": (text(REPEATING, 30, logit_bias={str(REPEATED_TOKEN): -100}), True),
    "logit_bias_nudges_the_drafted_token": (text(REPEATING, 30, logit_bias={str(REPEATED_TOKEN): 2}), True),
    "presence_penalty": (text(REPEATING, 40, presence_penalty=1.5), True),
    "frequency_penalty": (text(REPEATING, 40, frequency_penalty=0.7), True),
    "repetition_penalty": (text(REPEATING, 40, repetition_penalty=1.3), True),
    "all_penalties_chat": (chat(HELLO, 40, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2),
                           True),
    "negative_penalties": (text("hello world", 40, presence_penalty=-1.0, frequency_penalty=-0.5), True),
}
# Cases whose paths default cases take, only with HELIOS_SPECULATIVE_SWEEP=1: max_tokens 5 (between D + 1 and D + 3,
# both asked), the chat boundaries 2 and 5 (the text ones are asked, and chat's first speculating limit 4), negative
# penalties (presence_penalty and frequency_penalty take the penalty path with positive values), a positive bias on
# the drafted token (the ban takes the bias path), json_object (json_schema takes the grammar path), a late stop
# string (stop_inside_a_repeated_run stops a drafted run), the system turn (chat renders the template), n = 2 chat
# choices (n_3's choices), the three penalties at once (each alone), chat prompt scores (prompt_logprobs') and
# tool_choice "required" (tools_named forces a call through the tool-call grammar, a lane that cannot draft).
_SWEPT_CASES = {"max_tokens_5", "max_tokens_2_of_hello", "max_tokens_5_of_hello", "negative_penalties",
                "logit_bias_nudges_the_drafted_token", "json_object", "stop_late", "chat_system", "n_2_chat",
                "all_penalties_chat", "chat_prompt_logprobs", "tools_required"}
if not swept("HELIOS_SPECULATIVE_SWEEP"):
    CASES = {name: case for name, case in CASES.items() if name not in _SWEPT_CASES}
PENALIZED = ("presence_penalty", "frequency_penalty", "repetition_penalty")
# By default each case goes to the learned server alone one way and at once with every other case the other way
# (JSON or streamed, in turn over the cases): each case's JSON and stream are both checked, each way's path taken
# alone and at once by half the cases. HELIOS_SPECULATIVE_SWEEP=1 sends every case both ways alone and at once.
STREAMED_AT_ONCE = {name: index % 2 == 1 for index, name in enumerate(reversed(CASES))}


def ways(name: str, at_once: bool) -> tuple[bool, ...]:
    """Whether `name` is streamed (True), sent as JSON (False) or both, alone or at once."""
    if swept("HELIOS_SPECULATIVE_SWEEP"):
        return (False, True)
    return (STREAMED_AT_ONCE[name] if at_once else not STREAMED_AT_ONCE[name],)


def path_of(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


async def post(server: Server, body: dict) -> dict:
    response = await server.client.post(path_of(body), json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def stream(server: Server, body: dict) -> dict:
    """The streamed response to `body`, reassembled into one body (see `merge`)."""
    merged: dict = {}
    async with server.client.stream("POST", path_of(body), json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            choices = chunk.pop("choices")
            merge(merged, chunk)
            for choice in choices:
                merge(merged.setdefault("choices", {}).setdefault(choice.pop("index"), {}), choice)
    return merged


def merge(into: dict, delta: dict) -> None:
    """Folds a chunk into the reassembled body: strings and lists concatenate, objects merge, and
    a tool call's fragments join by its index (its random id dropped)."""
    for key, value in delta.items():
        if key in ("id", "created", "reused_prompt_tokens"):
            continue
        if key == "tool_calls":
            calls = into.setdefault(key, {})
            for call in value:
                merge(calls.setdefault(call["index"], {}), {k: v for k, v in call.items() if k != "index"})
        elif value is None or key not in into or into[key] is None:
            if value is not None or key not in into:
                into[key] = value
        elif isinstance(value, str) and key not in ("role", "type", "finish_reason", "object", "model"):
            into[key] += value
        elif isinstance(value, list):
            into[key] = into[key] + value
        elif isinstance(value, dict):
            merge(into[key], value)
        else:
            into[key] = value


def canonical(body: dict) -> dict:
    """A JSON body without what differs by design: its id, creation time, tool-call ids and the
    prompt tokens this server happened to have cached."""
    body = {k: v for k, v in body.items() if k not in ("id", "created", "reused_prompt_tokens")}
    choices = []
    for choice in body.get("choices", []):
        message = choice.get("message")
        if message and message.get("tool_calls"):
            calls = [{k: v for k, v in call.items() if k != "id"} for call in message["tool_calls"]]
            choice = {**choice, "message": {**message, "tool_calls": calls}}
        choices.append(choice)
    return {**body, "choices": choices}


def assert_same(actual, expected, where: str = "") -> None:
    """Equal, floats within float32 noise (log-probabilities of batches composed differently); usage's
    ``cached_tokens`` is present on both sides but, as ``reused_prompt_tokens``, what this server
    happened to have cached."""
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        assert actual == pytest.approx(expected, rel=1e-4, abs=1e-4), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (where, actual, expected)
        for key in expected.keys() - {"cached_tokens"}:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (where, actual, expected)
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, (where, actual, expected)


@pytest.fixture(scope="module")
def expected(servers, runner):
    """The reference server's JSON and streamed answer to every case: each case's two at once, two cases at a time
    (four lanes: one decode batch of the core). The reference never speculates, and a lane's tokens do not depend
    on the lanes beside it (log-probabilities within float noise, which `assert_same` allows: the learned server's
    all-at-once run relies on the same), so the four lanes decode in the steps one lane would take alone."""
    reference = servers[REFERENCE]
    gate = asyncio.Semaphore(2)

    async def one(body: dict) -> tuple[dict, dict]:
        async with gate:
            answer, streamed = await asyncio.gather(post(reference, body), stream(reference, body))
            return canonical(answer), streamed

    async def ask():
        answers = await asyncio.gather(*(one(body) for body, _ in CASES.values()))
        return dict(zip(CASES, answers))

    return runner.run(ask())


@pytest.mark.parametrize("name", CASES)
def test_each_request_is_answered_as_without_speculation(name, servers, runner, expected):
    body, speculates = CASES[name]

    async def ask(server: Server):
        before = server.counting.accepted
        answers = [(await stream(server, body)) if streamed else canonical(await post(server, body))
                   for streamed in ways(name, at_once=False)]
        return answers, server.counting.accepted - before

    for server_name in ALONE:
        answers, accepted = runner.run(ask(servers[server_name]))
        for streamed, answer in zip(ways(name, at_once=False), answers):
            assert_same(answer, expected[name][streamed], f"{server_name} {'stream' if streamed else 'JSON'}")
        if server_name == "learned":
            assert (accepted > 0) == speculates, (server_name, accepted)


def test_the_cases_exercise_what_they_name(expected):
    finish = {name: [c["finish_reason"] for c in body["choices"]] for name, (body, _) in expected.items()}
    assert all(reason == ["stop"] for name, reason in finish.items() if name.startswith("eos_after"))
    assert finish["stop_inside_a_repeated_run"] == finish["stop_token_ids"] == ["stop"]
    plain_ids = expected["max_tokens_6"][0]["choices"][0]["token_ids"]
    assert REPEATED_TOKEN in plain_ids
    banned = expected["logit_bias_bans_the_drafted_token"][0]["choices"][0]["token_ids"]
    assert REPEATED_TOKEN not in banned
    unpenalized = expected["repeating"][0]["choices"][0]["token_ids"]
    for name in PENALIZED:  # each penalty changes the greedy continuation
        assert expected[name][0]["choices"][0]["token_ids"] != unpenalized, name
    calls = expected["tools_named"][0]["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    if "tools_required" in expected:  # HELIOS_SPECULATIVE_SWEEP=1
        assert expected["tools_required"][0]["choices"][0]["message"]["tool_calls"]


@pytest.mark.parametrize("server_name", [*SPECULATING, *ALLOCATED, *PLAIN])
def test_all_requests_at_once_are_answered_as_one_at_a_time(server_name, servers, runner, expected):
    # JSON or streamed requests of every case, five at a time (at most 20 choices: the permits):
    # lanes that draft share rounds with lanes that cannot (grammar, stops, max_tokens) and with
    # steps that do not speculate at all (log-probabilities, logit bias)
    server = servers[server_name]
    gate = asyncio.Semaphore(5)
    counting = server.counting
    accepted, trimmed, mixed_steps = counting.accepted, counting.trimmed_rounds, counting.operations["MIXED"]
    before_mixed = len(server.mixed_rounds)

    async def one(name: str, streamed: bool):
        async with gate:
            body = CASES[name][0]
            return (await stream(server, body)) if streamed else canonical(await post(server, body))

    async def everything():
        # by default each case once, JSON and streamed in turn (the other way alone in
        # test_each_request_is_answered_as_without_speculation); both ways with HELIOS_SPECULATIVE_SWEEP=1
        tasks = [(name, streamed) for name in reversed(CASES) for streamed in ways(name, at_once=True)]
        return tasks, await asyncio.gather(*(one(name, streamed) for name, streamed in tasks))

    tasks, answers = runner.run(everything())
    for (name, streamed), answer in zip(tasks, answers):
        assert_same(answer, expected[name][streamed], f"{server_name} {name} {'stream' if streamed else 'JSON'}")
    if server_name != "decode":
        assert counting.accepted > accepted
        assert len(server.mixed_rounds) > before_mixed
    if server_name == "learned":  # rounds trimmed to P, and decoding lanes in MIXED steps
        assert counting.trimmed_rounds > trimmed and counting.operations["MIXED"] > mixed_steps


# -- seeded sampling ------------------------------------------------------------------------------

SAMPLED_PROMPT = [220, 291, 58, 102]
SAMPLED = {"temperature": 1.0, "top_k": 4}  # four candidates a token: few draws resolve the frequencies
NUM_REQUESTS, NUM_CHOICES = 24, 16
TOLERANCE = 0.1  # 384 draws a position: a frequency's standard error is at most 0.026


def exact_marginals(checkpoint, prompt: list[int]) -> torch.Tensor:
    """[2, vocab]: the first and second output tokens' distributions after `prompt` (temperature 1,
    top-k 4) by transformers on the same weights: p(x1) and sum_x1 p(x1) p(x2 | x1)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).float().eval()
    vocab = model.config.vocab_size
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1:]
        second = model(torch.tensor([prompt + [token] for token in range(vocab)])).logits[:, -1]
    p1, p2 = top_k_weights(first)[0], top_k_weights(second)
    return torch.stack((p1, p1 @ p2))


def top_k_weights(logits: torch.Tensor) -> torch.Tensor:
    probabilities = torch.softmax(logits.double(), dim=-1)
    kept = torch.zeros_like(probabilities).scatter(-1, probabilities.topk(SAMPLED["top_k"], dim=-1).indices, 1.0)
    weights = probabilities * kept
    return weights / weights.sum(-1, keepdim=True)


def sampled_frequencies(server: Server, runner, vocab: int) -> torch.Tensor:
    """[2, vocab]: how often each token came first and second among every choice of requests
    without a seed (they speculate), their fresh seeds drawn from a fixed sequence."""
    # the first token is the prefill's, the second the first round's (one proposal verified)
    body = {"model": SERVED_ID, "prompt": SAMPLED_PROMPT, "max_tokens": 3, "n": NUM_CHOICES, **SAMPLED,
            "return_token_ids": True}
    frontend, fresh = server.served.frontend, itertools.count(1000, NUM_CHOICES)  # choice j: seed + j
    drawn, frontend._draw_seed = frontend._draw_seed, fresh.__next__

    async def draw():
        return [await post(server, body) for _ in range(NUM_REQUESTS)]

    try:
        answers = runner.run(draw())
    finally:
        frontend._draw_seed = drawn
    tokens = torch.tensor([c["token_ids"][:2] for a in answers for c in a["choices"]])
    return torch.stack([torch.bincount(tokens[:, i], minlength=vocab).double() / len(tokens) for i in range(2)])


def test_seeded_sampling_keeps_the_target_distribution(servers, runner, checkpoint_and_core):
    checkpoint, draft, _ = checkpoint_and_core
    exact, drafted = exact_marginals(checkpoint, SAMPLED_PROMPT), exact_marginals(draft, SAMPLED_PROMPT)
    assert (exact[1] - drafted[1]).abs().max() > 2 * TOLERANCE  # emitting unchecked proposals would show
    server = servers["learned"]
    before = server.counting.accepted
    observed = sampled_frequencies(server, runner, exact.shape[-1])
    assert (observed - exact).abs().max() < TOLERANCE, (observed, exact)
    assert server.counting.accepted > before


SEEDED = {"model": SERVED_ID, "prompt": REPEATING, "max_tokens": 24, "seed": 41, **SAMPLED, "return_token_ids": True}


@pytest.mark.parametrize("server_name", [*ALONE, *ALLOCATED])
def test_seeded_choices_equal_single_requests_with_their_seeds(server_name, servers, runner):
    # README: choice j samples with seed s + j and equals a single request with that seed. A
    # speculating lane's tokens would depend on its rounds, which the other lanes move (prefix
    # allocation within P, MIXED steps too): seeded requests never speculate.
    server = servers[server_name]
    seeded = {**SEEDED, "max_tokens": 12}  # each choice's own draws from the first token on: 12 tokens show them

    async def ask():
        together = await post(server, {**seeded, "n": 4})
        alone = [await post(server, {**seeded, "seed": 41 + j}) for j in range(4)]
        return together, alone

    before = server.counting.accepted
    together, alone = runner.run(ask())
    assert [c["token_ids"] for c in together["choices"]] == [a["choices"][0]["token_ids"] for a in alone]
    assert len({tuple(c["token_ids"]) for c in together["choices"]}) == 4
    assert server.counting.accepted == before


@pytest.mark.parametrize("server_name", [*ALONE, *ALLOCATED])
def test_a_seeded_request_answers_the_same_beside_requests_that_change_the_rounds(server_name, servers, runner):
    # A logprobs request speculates beside it (greedy); unseeded sampled and greedy requests speculate.
    server = servers[server_name]
    beside = [{**text(REPEATING, 40), "logprobs": 1}, {**text(REPEATING, 40), **SAMPLED},
              text(SAMPLED_PROMPT, 40), {**text(REPEATING, 30), **SAMPLED, "n": 3}]

    async def ask():
        alone = await post(server, SEEDED)
        together = await asyncio.gather(post(server, SEEDED), *(post(server, body) for body in beside),
                                        post(server, SEEDED))
        return alone, together

    before = server.counting.accepted
    alone, together = runner.run(ask())
    assert server.counting.accepted > before  # the others speculated beside it
    assert together[0]["choices"][0]["token_ids"] == together[-1]["choices"][0]["token_ids"] \
        == alone["choices"][0]["token_ids"]
