"""Every frontend family end to end: a tiny random checkpoint with the family's model_type, real
special tokens and published chat template is prepared into a core, loaded and served.

For each family: prepare selects the family's tool syntax and reasoning from the template alone;
the HTTP server renders a multi-turn conversation with tools to exactly the token ids transformers'
`apply_chat_template` gives; the served frontend parses a tool call written in the family's syntax
into OpenAI tool_calls and splits reasoning where the template reasons; a json_schema request at
temperature 1 returns valid compact JSON within 128 tokens; the generation_config recommendations
are the core's sampling defaults, and a `do_sample: false` core answers greedily by default.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.frontend.decoding.syntax import ReasoningSyntaxKind, ToolSyntaxKind
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.schemas import ChatCompletionRequest
from helios.server.service import ServedModel
from support.family_checkpoints import CASES, FAMILY_NAMESPACE, FamilyCase, hf_tokenizer, prepared_family_core

from .served import ids_of, run_output

NAMESPACE = FAMILY_NAMESPACE
TOOL_KINDS = {
    "hermes": ToolSyntaxKind.JSON_CALLS, "qwen3-coder": ToolSyntaxKind.QWEN_CODER_FUNCTIONS,
    "deepseek-v3": ToolSyntaxKind.JSON_CALLS, "deepseek-v3.1": ToolSyntaxKind.JSON_CALLS, "glm-4.5": ToolSyntaxKind.GLM_ARGUMENTS,
    "llama3": ToolSyntaxKind.JSON_CALLS, "mistral": ToolSyntaxKind.JSON_CALLS,
    "harmony": ToolSyntaxKind.HARMONY_CHANNELS,
}
# Families whose frames carry reasoning on channels (the others reason in think tags where they do).
CHANNEL_REASONING = {"harmony": ReasoningSyntaxKind.HARMONY_CHANNELS}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"]},
}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False}
CALL_ID = "abcdefghi"  # nine alphanumerics: the Mistral template requires them


def conversation(arguments) -> list[dict]:
    call = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family(request, tmp_path_factory, qwen_tokenizer, deepseek_tokenizer):
    case: FamilyCase = request.param
    # No token-logprobs programs: no request here asks for log-probabilities.
    tokenizer, opened = prepared_family_core(case, tmp_path_factory.getbasetemp(), qwen_tokenizer, deepseek_tokenizer)
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=4))
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1, owned_by=NAMESPACE)
    served.start()
    with asyncio.Runner() as runner:
        yield case, tokenizer, served, create_app(served), runner
    served.shutdown()


def served_chat(family, body: dict) -> httpx.Response:
    """`body` answered by the family's app (a 200, asserted)."""
    _, _, _, app, runner = family

    async def call():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await client.post("/v1/chat/completions", json=body)

    response = runner.run(call())
    assert response.status_code == 200, response.text
    return response


def post(family, body: dict) -> dict:
    return served_chat(family, body).json()


def test_prepare_declares_the_family_from_its_template(family):
    case, _, served, _, _ = family
    syntax = served.frontend.syntax.output
    assert syntax.tool_kind is TOOL_KINDS[case.name]
    expected = ReasoningSyntaxKind.THINK_TAGS if case.reasoning else ReasoningSyntaxKind.NONE
    expected = CHANNEL_REASONING.get(case.name, expected)
    assert syntax.reasoning_kind is expected  # the DeepSeek tokenizer has <think>; its V3 template does not


def test_generation_config_recommendations_are_the_sampling_defaults(family):
    case, _, served, _, _ = family
    sampling = served.frontend.settings.sampling
    if case.generation.get("do_sample") is False:
        assert sampling.temperature == 0.0
    else:
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            if name in case.generation:
                assert getattr(sampling, name) == pytest.approx(case.generation[name]), name


def test_prompt_tokens_equal_transformers_apply_chat_template(family):
    case, tokenizer, _, _, _ = family
    body = {"model": case.name, "messages": conversation('{"city": "Paris"}'), "tools": [WEATHER],
            "max_tokens": 1, "return_token_ids": True}
    served_ids = post(family, body)["prompt_token_ids"]
    reference = hf_tokenizer(case, tokenizer).apply_chat_template(
        conversation('{"city": "Paris"}' if case.string_arguments else {"city": "Paris"}), tools=[WEATHER],
        add_generation_prompt=True, tokenize=True, return_dict=False,
    )
    assert served_ids == list(reference)


def test_a_tool_call_in_the_family_syntax_becomes_openai_tool_calls(family):
    case, tokenizer, served, _, _ = family
    request = ChatCompletionRequest.model_validate(
        {"model": case.name, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
         "chat_template_kwargs": case.thinking_kwargs or None})
    prepared = served.frontend.prepare_chat(request, request_id="f")
    pieces = [case.tool_text]
    channels = served.frontend.syntax.output.channels
    if channels is not None:  # an analysis message, then the call in its own frame
        pieces = [channels.channel_control, channels.reasoning_channels[0], channels.message_control, "Let me check.",
                  channels.end_control, channels.start_control, channels.role, case.tool_text]
    elif case.reasoning:
        think = served.frontend.syntax.output.think
        opened = [] if case.thinking_kwargs else [think.open]  # a thinking prompt opened reasoning itself
        pieces = [*opened, think.after_open + "Let me check." + think.before_close, think.close,
                  think.after_close, case.tool_text]
    eos = tokenizer.token_to_id(case.eos)
    _, final = run_output(prepared, ids_of(tokenizer, *pieces) + [eos])
    message = prepared.response_body(final)["choices"][0]["message"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris"})]
    assert (message.get("content") or "") == ""
    assert (message.get("reasoning_content") or "") == ("Let me check." if case.reasoning else "")


def test_json_schema_at_temperature_one_is_valid_compact_json(family):
    case, _, _, _, _ = family
    body = {"model": case.name, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
            "temperature": 1.0, "max_tokens": 128, "seed": 11}
    choice = post(family, body)["choices"][0]
    value = json.loads(choice["message"]["content"])
    assert isinstance(value["ok"], bool) and 0 <= value["n"] <= 9 and set(value) == {"ok", "n"}
    assert choice["message"]["content"] == json.dumps(value, separators=(",", ":"))  # no free whitespace
    assert choice["finish_reason"] == "stop"


def test_requests_without_temperature_follow_the_recommendation(family):
    """do_sample: false -> greedy: two requests with different seeds answer the same; otherwise the
    request samples at the recommended temperature."""
    case, _, served, _, _ = family
    body = {"model": case.name, "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 12}
    request = ChatCompletionRequest.model_validate(body)
    temperature = served.frontend.prepare_chat(request, request_id="t").params.sampling.temperature
    if case.generation.get("do_sample") is False:
        assert temperature == 0.0
        first, second = post(family, {**body, "seed": 1}), post(family, {**body, "seed": 99})
        assert first["choices"][0]["message"] == second["choices"][0]["message"]
        assert first["usage"]["completion_tokens"] > 0
    else:
        assert temperature == pytest.approx(case.generation["temperature"])


def test_a_forced_call_is_written_in_the_family_syntax_and_parsed(family):
    """tool_choice "required" at temperature 1: the grammar makes the random model write a call in the
    family's own syntax, and the server parses it into OpenAI tool_calls."""
    case, tokenizer, served, _, _ = family
    body = {"model": case.name, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0, "max_tokens": 128,
            "seed": 5, "return_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
    choice = post(family, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls", json.dumps(choice)
    calls = choice["message"]["tool_calls"]
    assert len(calls) >= 1 and all(c["function"]["name"] == "get_weather" for c in calls)
    assert all(json.loads(c["function"]["arguments"])["city"] in ("Paris", "Rome") for c in calls)
    assert not choice["message"].get("content")
    written = tokenizer.decode(choice["token_ids"], skip_special_tokens=False)
    tools, channels = served.frontend.syntax.output.tools, served.frontend.syntax.output.channels
    if channels is not None:
        assert f"{channels.recipient_marker}{channels.tool_namespace}get_weather" in written
    else:
        assert (tools.block_open or '{"name"') in written  # the family's own markup, as the parsers read it


def one_json_call(tools) -> str:
    """A get_weather call (city Paris) in a JSON-call syntax's block, as its grammars write one."""
    arguments = '{"city":"Paris"}'
    if tools.name_key:
        call = '{"%s": "get_weather", "%s": %s}' % (tools.name_key, tools.arguments_key, arguments)
        if not tools.block_open:
            return call
        return f"{tools.block_open}\n{call}\n{tools.block_close}" if tools.block_close else f"{tools.block_open}[{call}]"
    call = (f"{tools.invoke_open}get_weather{tools.name_end}{tools.arguments_open}{arguments}{tools.arguments_close}"
            f"{tools.invoke_close}")
    return ("" if tools.invoke_open == tools.block_open else tools.block_open) + call + tools.block_close


def test_parallel_false_without_forcing_allows_text_or_one_call(family):
    """``parallel_tool_calls: false`` with ``tool_choice`` auto, which OpenAI clients (the Agents SDK
    among them) send routinely, was a 400 on JSON-call families ("cannot be honoured without forcing
    a call"); vLLM serves it. The grammar now allows free text, or one call and then only the end, in
    the family's syntax; the call comes back as the one tool call, finish_reason ``tool_calls``, and
    the request is served over HTTP, streamed and not."""
    case, tokenizer, served, _, _ = family
    body = {"model": case.name, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "parallel_tool_calls": False, "chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
    prepared = served.frontend.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="p")
    assert prepared.grammar is not None
    eos = tokenizer.token_to_id(case.eos)
    if TOOL_KINDS[case.name] is ToolSyntaxKind.JSON_CALLS:
        call = ids_of(tokenizer, one_json_call(served.frontend.syntax.output.tools))
        matcher = prepared.grammar.fork()
        assert all(matcher.consume_token(token_id) for token_id in call)
        mask = matcher.bitmask()
        allowed = [i for i in range(tokenizer.get_vocab_size()) if (int(mask[i // 32]) >> (i % 32)) & 1]
        assert eos in allowed and not (set(allowed) - set(served.frontend.settings.eos_token_ids))  # no second call
        _, final = run_output(prepared, call + [eos])
        choice = prepared.response_body(final)["choices"][0]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in choice["message"]["tool_calls"]] == [("get_weather", {"city": "Paris"})]
        assert choice["finish_reason"] == "tool_calls"
        text = ids_of(tokenizer, "It is sunny.")
        assert accepts(prepared.grammar, text + [eos])
        assert accepts(prepared.grammar, text + call + [eos])  # (Llama's: text the parser reads as text)
        structured = {**body, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}}
        answer_only = served.frontend.prepare_chat(ChatCompletionRequest.model_validate(structured), request_id="s")
        assert accepts(answer_only.grammar, ids_of(tokenizer, '{"ok":true,"n":3}') + [eos])  # was a 400 too
        assert not accepts(answer_only.grammar, call)
    sampled = {**body, "temperature": 1.0, "max_tokens": 24, "seed": 3}
    whole = post(family, sampled)["choices"][0]
    chunks = [json.loads(line[len("data: "):]) for line in post_stream(family, {**sampled, "stream": True}).splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [choice for chunk in chunks for choice in chunk["choices"]]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == (whole["message"].get("content") or "")
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == [whole["finish_reason"]]


def accepts(matcher, ids) -> bool:
    probe = matcher.fork()
    return all(probe.consume_token(token_id) for token_id in ids)


def post_stream(family, body: dict) -> str:
    return served_chat(family, body).text
