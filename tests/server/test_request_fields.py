"""The request fields of OpenAI's API reference (the `openai` client's ``completion_create_params``),
each sent by the official client to the in-process app over the tiny core: every field has its
documented effect (README "Request fields") or is a 400 whose ``param`` names it, never a 500 and
never accepted while its effect is missing."""

from __future__ import annotations

import openai
import pytest

from support.server_core import NAMESPACE, SERVED_ID, openai_client, served_tiny_core

HELLO = [{"role": "user", "content": "hello"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}
OBJECT_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 8, frontend_workers=2, owned_by=NAMESPACE) as served:
        yield served


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


def chat(runner, client, **fields):
    return runner.run(client.chat.completions.create(
        **{"model": SERVED_ID, "messages": HELLO, "max_tokens": 3, "temperature": 0, **fields}))


def text(runner, client, **fields):
    return runner.run(client.completions.create(
        **{"model": SERVED_ID, "prompt": "hello", "max_tokens": 3, "temperature": 0, **fields}))


def refused(runner, create, **fields) -> dict:
    """The 400's error body of a request the client sends with `fields`."""
    with pytest.raises(openai.BadRequestError) as caught:
        create(**fields)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"], error
    return error


def contents(response) -> list[str]:
    return [choice.message.content for choice in response.choices]


# -- fields OpenAI has and Helios does not serve ----------------------------------------------------------

# The client sends null for a field given as None: what SDKs and frameworks that always send every
# field they know send for "not given". Each was a 400 ("not a field this server accepts").
NULL_CHAT_FIELDS = ("audio", "prediction", "verbosity", "web_search_options", "moderation", "functions",
                    "function_call", "prompt_cache_retention", "prompt_cache_options", "modalities",
                    "safety_identifier", "prompt_cache_key")


def test_fields_sent_as_null_mean_not_given(runner, client):
    plain = chat(runner, client)
    nulls = chat(runner, client, extra_body={name: None for name in NULL_CHAT_FIELDS})
    assert contents(nulls) == contents(plain)
    assert text(runner, client, suffix=None).choices[0].text == text(runner, client).choices[0].text


def test_identifiers_and_cache_hints_change_nothing(runner, client):
    """``safety_identifier`` (``user``'s successor), ``prompt_cache_key`` (prefixes are cached by
    content) and ``modalities: ["text"]`` (what Helios generates) are accepted."""
    plain = chat(runner, client)
    hinted = chat(runner, client, safety_identifier="user-1234", prompt_cache_key="session-9", modalities=["text"],
                  user="u", metadata={"k": "v"}, store=False, service_tier="auto")
    assert contents(hinted) == contents(plain) and hinted.usage == plain.usage
    assert refused(runner, lambda **f: chat(runner, client, **f), safety_identifier="x" * 257)["param"] == \
        "safety_identifier"


@pytest.mark.parametrize("fields, param", [
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities[1]"),
    ({"modalities": []}, "modalities"),
    ({"prediction": {"type": "content", "content": "hello"}}, "prediction"),
    ({"verbosity": "low"}, "verbosity"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"extra_body": {"moderation": {"model": "omni-moderation-latest"}}}, "moderation"),
    ({"extra_body": {"prompt_cache_retention": "24h"}}, "prompt_cache_retention"),
    ({"extra_body": {"prompt_cache_options": {"mode": "implicit"}}}, "prompt_cache_options"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"store": True}, "store"),
    ({"service_tier": "flex"}, "service_tier"),
])
def test_an_unserved_field_with_a_value_is_a_400_naming_it(runner, client, fields, param):
    error = refused(runner, lambda **f: chat(runner, client, **f), **fields)
    assert error["param"] == param, error


def test_a_completion_suffix_is_a_400_naming_it(runner, client):
    error = refused(runner, lambda **f: text(runner, client, **f), suffix="}")
    assert error["param"] == "suffix" and "not served" in error["message"], error


# -- output limits ------------------------------------------------------------------------------------


def test_max_tokens_and_max_completion_tokens_given_equal_are_one_limit(runner, client):
    """Clients that target old and new servers send both; equal values were a 400."""
    both = chat(runner, client, max_tokens=2, max_completion_tokens=2)
    assert both.usage.completion_tokens == 2 and both.choices[0].finish_reason == "length"
    newer = chat(runner, client, max_tokens=None, max_completion_tokens=2)
    assert contents(newer) == contents(both)
    error = refused(runner, lambda **f: chat(runner, client, **f), max_tokens=2, max_completion_tokens=3)
    assert error["param"] == "max_completion_tokens" and "differ" in error["message"], error


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": None, "max_completion_tokens": 0}, "max_completion_tokens"),
])
def test_a_zero_chat_output_limit_is_a_400(runner, client, fields, param):
    assert refused(runner, lambda **f: chat(runner, client, **f), **fields)["param"] == param


# -- sampling values ------------------------------------------------------------------------------------


def test_top_p_zero_keeps_only_the_most_probable_token(runner, client):
    """OpenAI's range for top_p includes 0 (it was a 400): the smallest nucleus, so any seed and
    temperature give the greedy tokens."""
    greedy = contents(chat(runner, client, max_tokens=6, n=2))[0]
    sampled = chat(runner, client, max_tokens=6, n=3, temperature=1.8, top_p=0, seed=11)
    assert contents(sampled) == [greedy] * 3
    completion = text(runner, client, max_tokens=6, temperature=1.8, top_p=0, seed=5, extra_body={"top_k": 40})
    assert completion.choices[0].text == text(runner, client, max_tokens=6).choices[0].text


def test_vllm_s_top_k_minus_one_keeps_every_token_as_zero_does(runner, client):
    """vLLM's "consider all tokens" (its default, which clients written for it send) was a 400."""
    def sampled(top_k: int) -> list[str]:
        return contents(chat(runner, client, max_tokens=6, n=2, temperature=1.5, seed=7, extra_body={"top_k": top_k}))

    assert sampled(-1) == sampled(0) != sampled(1)
    text_fields = {"max_tokens": 6, "temperature": 1.5, "seed": 7}
    assert text(runner, client, **text_fields, extra_body={"top_k": -1}).choices[0].text == \
        text(runner, client, **text_fields, extra_body={"top_k": 0}).choices[0].text
    assert refused(runner, lambda **f: chat(runner, client, **f), extra_body={"top_k": -2})["param"] == "top_k"


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 2.01}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": -0.1}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"presence_penalty": 2.1}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"seed": 2**63}, "seed"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logit_bias": {"5": 101}}, 'logit_bias["5"]'),
    ({"logit_bias": {"-5": 1}}, 'logit_bias["-5"]'),
    ({"logit_bias": {"token": 1}}, "logit_bias.token"),
    ({"logit_bias": {"1000000": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 1, "05": 1}}, "logit_bias"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_a_value_out_of_its_range_is_a_400_naming_the_field(runner, client, fields, param):
    assert refused(runner, lambda **f: chat(runner, client, **f), **fields)["param"] == param


def test_edge_values_in_range_are_served(runner, client):
    greedy = contents(chat(runner, client))
    for fields in ({"temperature": 0, "top_p": 1}, {"stop": []}, {"stop": None}, {"logit_bias": {}},
                   {"presence_penalty": 2, "frequency_penalty": -2, "temperature": 0}, {"top_logprobs": 0},
                   {"logprobs": None, "top_logprobs": None}, {"seed": -(2**63)}, {"stream_options": None}):
        assert contents(chat(runner, client, **fields)) == greedy, fields
    logged = chat(runner, client, logprobs=True, top_logprobs=20)
    assert all(len(entry.top_logprobs) == 20 for entry in logged.choices[0].logprobs.content)
    assert chat(runner, client, temperature=2.0, seed=1).usage.completion_tokens == 3


@pytest.mark.parametrize("effort", ["xhigh", "max"])
def test_the_client_s_newer_reasoning_efforts_are_efforts(runner, client, effort):
    """The client's `ReasoningEffort` lists ``xhigh`` and ``max``; they were a 400. Like any effort
    but ``none`` they turn thinking on (the tiny template has no switch: they render as ``high``)."""
    from helios.frontend.preparation.client_fields import effective_template_kwargs

    assert effective_template_kwargs(effort, None, "enable_thinking") == {"enable_thinking": True}
    assert chat(runner, client, reasoning_effort=effort).usage == chat(runner, client, reasoning_effort="high").usage


# -- structured output and tools -----------------------------------------------------------------------------


def test_a_json_schema_name_follows_openai_s_rule(runner, client):
    """Letters, digits, underscores and dashes, at most 64 (``"my schema!"`` was accepted)."""
    def answer(name: str, **fields):
        return chat(runner, client, max_tokens=24, response_format={
            "type": "json_schema", "json_schema": {"name": name, "schema": OBJECT_SCHEMA, **fields}})

    assert answer("reply_v-2", strict=True).choices[0].message.content.startswith('{"a":')
    for name in ("my schema!", "a.b", "x" * 65, ""):
        error = refused(runner, answer, name=name)
        assert error["param"] == "response_format.json_schema.name", (name, error)
    error = refused(runner, lambda **f: chat(runner, client, **f),
                    response_format={"type": "json_schema", "json_schema": {"name": "reply", "strict": False}})
    assert error["param"] == "response_format.json_schema.schema", error


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}}}, "tool_choice"),
    ({"tools": [{"type": "custom", "custom": {"name": "grep"}}]}, "tools[0].type"),
])
def test_a_tool_choice_that_cannot_hold_is_a_400_naming_it(runner, client, fields, param):
    assert refused(runner, lambda **f: chat(runner, client, **f), **fields)["param"] == param


@pytest.mark.parametrize("tools", [None, []], ids=["no tools", "an empty list"])
def test_tool_choice_auto_without_tools_is_a_400_as_openai_answers(runner, client, tools):
    """``tool_choice: "auto"`` without ``tools`` was served as plain chat; OpenAI ("tool_choice is only
    allowed when tools are specified") and vLLM answer 400, and both refuse an empty list as well (it
    was served as no tools). ``required`` and a named function without tools are 400s above; ``none``
    without tools, and an empty list without a tool choice or with ``none``, are served (below)."""
    fields = {"tool_choice": "auto"} if tools is None else {"tool_choice": "auto", "tools": tools}
    error = refused(runner, lambda **f: chat(runner, client, **f), **fields)
    assert error["param"] == "tool_choice" and "only allowed when tools are specified" in error["message"], error


def test_tool_choices_that_hold_are_served(runner, client):
    greedy = contents(chat(runner, client))
    for fields in ({"tools": [], "tool_choice": "none"}, {"tools": []}, {"tool_choice": "none"},
                   {"tools": [WEATHER_TOOL], "tool_choice": "none"}, {"parallel_tool_calls": False}):
        assert contents(chat(runner, client, **fields)) == greedy, fields
    short_city = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
    named = chat(runner, client, max_tokens=120, tools=[short_city], parallel_tool_calls=False,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and named.choices[0].finish_reason == "tool_calls"


def test_stop_strings_combine_with_parallel_tool_calls_false(runner, client):
    """``parallel_tool_calls: false`` with ``stop`` was a 400 ("stop strings cannot be combined with
    ... parallel_tool_calls=false"), which OpenAI and vLLM serve: the free answer it allows is cut by
    a stop string as under ``auto``. A forced call still refuses them (it must be written whole)."""
    fields = {"tools": [WEATHER_TOOL], "max_tokens": 12, "stop": ["a", "e", "o"]}
    single = chat(runner, client, parallel_tool_calls=False, **fields)
    (choice,) = single.choices
    assert choice.finish_reason in ("stop", "length") and not set("aeo") & set(choice.message.content or "")
    error = refused(runner, lambda **f: chat(runner, client, **f), tool_choice="required", **fields)
    assert error["param"] == "stop"


# -- completions: prompt forms, best_of, echo -------------------------------------------------------------


def test_every_prompt_form_is_served(runner, client):
    one = text(runner, client, prompt=[10, 11])
    assert one.choices[0].text == text(runner, client, prompt=[[10, 11]]).choices[0].text
    batch = text(runner, client, prompt=["hello", "world"], n=2)
    assert [choice.index for choice in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == text(runner, client).choices[0].text
    assert text(runner, client, prompt=[[10, 11], [12]]).usage.prompt_tokens == 3


@pytest.mark.parametrize("fields, param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt[0]"),  # a batch names the prompt it cannot serve
    ({"prompt": ["hello", ""]}, "prompt[1]"),
    ({"prompt": [[10], "hello"]}, "prompt[1]"),
    ({"prompt": [10**6]}, "prompt"),
    ({"prompt": [[10], [11], [12], [13], [14]], "n": 4}, "n"),  # 20 choices: param was null
    ({"prompt": ["a", "b", "c"], "n": 6}, "n"),
    ({"best_of": 2}, "best_of"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"logprobs": 21}, "logprobs"),
    ({"echo": True, "logprobs": 0}, "echo"),  # the tiny core has no scored-prefill program
    ({"max_tokens": 0}, "max_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"extra_body": {"max_completion_tokens": 3}}, "max_completion_tokens"),
])
def test_a_completion_field_that_cannot_hold_is_a_400_naming_it(runner, client, fields, param):
    assert refused(runner, lambda **f: text(runner, client, **f), **fields)["param"] == param


@pytest.mark.parametrize("prompt", [None, 5, {"text": "hello"}])
def test_a_prompt_of_no_form_is_a_400_listing_the_forms(runner, client, prompt):
    """The client's type allows a null prompt (OpenAI: an empty document); Helios generates from
    none, and said "Input should be a valid list" for it."""
    error = refused(runner, lambda **f: text(runner, client, **f), prompt=prompt)
    assert error["param"] == "prompt" and "a text, a list of token ids, or a batch" in error["message"], error


def test_echo_best_of_and_null_fields_of_a_completion(runner, client):
    plain = text(runner, client).choices[0].text
    assert text(runner, client, echo=True).choices[0].text == "hello" + plain
    echoed = text(runner, client, echo=True, max_tokens=0).choices[0]
    assert echoed.text == "hello" and echoed.finish_reason == "length"
    assert [c.text for c in text(runner, client, n=2, best_of=2).choices] == [plain, plain]
    assert text(runner, client, logprobs=None, echo=None, best_of=None, n=None, stop=[]).choices[0].text == plain


@pytest.mark.parametrize("create", [chat, text])
def test_stream_obfuscation_off_is_served_and_on_is_a_400(runner, client, create):
    """``stream_options.include_obfuscation`` (the client's `ChatCompletionStreamOptionsParam`) was a
    400 whatever its value; Helios pads no chunk, so false (and null) is what it does."""
    async def usage(stream):
        return [chunk.usage async for chunk in stream][-1]

    for off in (False, None):
        stream = create(runner, client, stream=True, stream_options={"include_usage": True, "include_obfuscation": off})
        assert runner.run(usage(stream)).completion_tokens == 3
    error = refused(runner, lambda **f: create(runner, client, **f), stream=True,
                    stream_options={"include_obfuscation": True})
    assert error["param"] == "stream_options.include_obfuscation", error


@pytest.mark.parametrize("create", [chat, text])
def test_n_choices_stream_each_with_its_index(runner, client, create):
    async def indices(stream) -> set[int]:
        return {choice.index async for chunk in stream for choice in chunk.choices}

    assert runner.run(indices(create(runner, client, n=2, stream=True))) == {0, 1}
