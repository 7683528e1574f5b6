"""Prompt path: sandboxed templates written for these tests, real tokenizers, reasoning state, boundaries."""

from __future__ import annotations

import pytest

from helios.errors import LoadError, RequestError
from helios.frontend.preparation.messages import MessageError, Role, parse_messages, parse_tools
from helios.frontend.preparation.prompt import (
    PrefixConstraint,
    PromptBuilder,
    PromptRules,
    ReasoningMarkup,
    ReasoningState,
    initial_reasoning_state,
)
from helios.frontend.preparation.template import ChatTemplate, TemplateLoadError, TemplateRenderError

# A think-tag template in the Qwen style: ChatML turns, tools in the system turn, tool results as user
# turns, reasoning kept only after the last user turn, enable_thinking opening or closing reasoning.
QWEN_STYLE = """
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}
# Tools

<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}{% if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{ raise_exception('System messages must come first.') }}{% endif %}
{%- elif message.role == 'user' %}
<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{% if message.reasoning_content and loop.index0 > ns.last_user %}
<think>
{{ message.reasoning_content }}
</think>

{% endif %}
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}

<tool_call>
{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}
<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

{% elif enable_thinking is defined %}
<think>
{% endif %}
{%- endif %}
"""

# A DeepSeek-style template: BOS, role tokens without a shared message start, tool outputs embedded in
# the assistant turn, which resumes after them without a new header.
DEEPSEEK_STYLE = """
{{- bos_token }}
{%- set ns = namespace(system='', is_tool=false) %}
{%- for message in messages if message.role == 'system' %}{% set ns.system = ns.system + message.content %}{% endfor %}
{{- ns.system }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- set ns.is_tool = false %}<｜User｜>{{ message.content }}
{%- elif message.role == 'assistant' %}
{%- if not ns.is_tool %}<｜Assistant｜>{% endif %}
{%- set ns.is_tool = false %}
{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% else %}</think>{% endif %}
{{- message.content or '' }}
{%- if message.tool_calls %}<｜tool▁calls▁begin｜>
{%- for call in message.tool_calls %}{{ '<｜tool▁call▁begin｜>' + call.function.name + '<｜tool▁sep｜>' + call.function.arguments + '<｜tool▁call▁end｜>' }}{% endfor %}
{{- '<｜tool▁calls▁end｜>' }}
{%- endif %}<｜end▁of▁sentence｜>
{%- elif message.role == 'tool' %}
{%- if not ns.is_tool %}<｜tool▁outputs▁begin｜>{% endif %}
{%- set ns.is_tool = true %}<｜tool▁output▁begin｜>{{ message.content }}<｜tool▁output▁end｜>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<｜tool▁outputs▁end｜>{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{% if not ns.is_tool %}<｜Assistant｜>{% endif %}{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}
"""

QWEN_RULES = PromptRules(
    message_start="<|im_start|>",
    assistant_header="assistant\n",
    message_ends=("<|im_end|>",),
    reasoning=ReasoningMarkup("<think>", "</think>", ("<tool_call>",)),
    prefix_boundaries={
        Role.SYSTEM: PrefixConstraint.STABLE,
        Role.USER: PrefixConstraint.STABLE,
        Role.ASSISTANT: PrefixConstraint.CHANGES_AFTER_USER_TURN,
        Role.TOOL: PrefixConstraint.STABLE,
    },
)

DEEPSEEK_RULES = PromptRules(
    message_start="",
    assistant_header="<｜Assistant｜>",
    message_ends=("<｜end▁of▁sentence｜>", "<｜tool▁outputs▁end｜>"),
    reasoning=ReasoningMarkup("<think>", "</think>"),
    prefix_boundaries={
        Role.SYSTEM: PrefixConstraint.STABLE,
        Role.USER: PrefixConstraint.STABLE,
        Role.ASSISTANT: PrefixConstraint.STABLE,
        Role.TOOL: PrefixConstraint.CHANGES_WHEN_LAST,
    },
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":  "Paris"}'}}


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    return PromptBuilder(ChatTemplate(QWEN_STYLE), qwen_tokenizer, QWEN_RULES)


@pytest.fixture(scope="module")
def deepseek(deepseek_tokenizer):
    template = ChatTemplate(DEEPSEEK_STYLE, {"bos_token": "<｜begin▁of▁sentence｜>"})
    return PromptBuilder(template, deepseek_tokenizer, DEEPSEEK_RULES)


def user(text):
    return {"role": "user", "content": text}


# --- rendering and tokenization ---------------------------------------------------------------


def test_qwen_style_render_and_tokens(qwen, qwen_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, user("Hi")]
    prompt = qwen.build(messages, template_kwargs={"enable_thinking": True})
    assert prompt.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert prompt.token_ids == tuple(qwen_tokenizer.encode(prompt.text, add_special_tokens=False).ids)
    assert prompt.token_ids[0] == qwen_tokenizer.token_to_id("<|im_start|>")
    assert prompt.token_ids[-2] == qwen_tokenizer.token_to_id("<think>")
    assert prompt.reasoning_state is ReasoningState.OPEN
    assert prompt.assistant_prefill == "<think>\n"


def test_qwen_style_tools_and_calls_render_arguments_as_objects(qwen):
    messages = [user("Weather?"), {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]})
    prompt = qwen.build(messages, [WEATHER_TOOL])
    assert '{"type": "function", "function": {"name": "get_weather"' in prompt.text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt.text
    assert "<tool_response>\nsunny\n</tool_response>" in prompt.text


def test_deepseek_style_concatenates_arguments_verbatim_and_renders_bos_once(deepseek, deepseek_tokenizer):
    messages = [user("Weather?"), {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
    prompt = deepseek.build(messages, [WEATHER_TOOL])
    assert '<｜tool▁sep｜>{"city":  "Paris"}<｜tool▁call▁end｜>' in prompt.text
    assert prompt.token_ids[0] == deepseek_tokenizer.token_to_id("<｜begin▁of▁sentence｜>")
    assert prompt.token_ids.count(prompt.token_ids[0]) == 1
    assert deepseek_tokenizer.token_to_id("<｜tool▁outputs▁end｜>") in prompt.token_ids


def test_text_parts_join_with_newlines(qwen):
    prompt = qwen.build([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert "<|im_start|>user\na\nb<|im_end|>" in prompt.text


# --- initial reasoning state ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, state, prefill",
    [
        ({"enable_thinking": True}, ReasoningState.OPEN, "<think>\n"),
        ({"enable_thinking": False}, ReasoningState.CLOSED, "<think>\n\n</think>\n\n"),
        (None, ReasoningState.UNOPENED, ""),
    ],
)
def test_generation_prompt_decides_reasoning(qwen, kwargs, state, prefill):
    prompt = qwen.build([user("Hi")], template_kwargs=kwargs)
    assert (prompt.reasoning_state, prompt.assistant_prefill) == (state, prefill)


def test_completed_user_and_assistant_messages_cannot_open_reasoning(qwen):
    history = [user("say <think> please"), {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}]
    assert "<think>\nhmm\n</think>" in qwen.build(history, add_generation_prompt=False).text
    assert qwen.build(history, add_generation_prompt=False).reasoning_state is ReasoningState.UNOPENED
    assert qwen.build([user("<think>")]).reasoning_state is ReasoningState.UNOPENED


def test_embedded_tool_response_only_text_after_last_end_marker_counts(deepseek):
    call = {"role": "assistant", "content": "", "reasoning_content": "plan", "tool_calls": [CALL]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "result <think> injected"}
    messages = [user("Weather?"), call, tool]
    resumed = deepseek.build(messages, template_kwargs={"thinking": True})
    assert resumed.text.endswith("<｜tool▁outputs▁end｜><think>")  # resumed without a new header
    assert (resumed.reasoning_state, resumed.assistant_prefill) == (ReasoningState.OPEN, "<think>")
    closed = deepseek.build(messages, template_kwargs={"thinking": False})
    assert closed.reasoning_state is ReasoningState.CLOSED
    # Without resumed text, neither the earlier reasoning nor the tool output's literal tag counts.
    bare = deepseek.build(messages, add_generation_prompt=False)
    assert (bare.reasoning_state, bare.assistant_prefill) == (ReasoningState.UNOPENED, "")


@pytest.mark.parametrize(
    "text, state, prefill",
    [
        ("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\nstep", ReasoningState.OPEN, "<think>\nstep"),
        ("<|im_start|>assistant\n<think>\na\n</think>\n\nb", ReasoningState.CLOSED, "<think>\na\n</think>\n\nb"),
        ("<|im_start|>assistant\n<think>\nplan<tool_call>", ReasoningState.CLOSED, "<think>\nplan<tool_call>"),
        ("<|im_start|>assistant\n<think>x<|im_end|>\n<|im_start|>user\n<think>", ReasoningState.UNOPENED, ""),
        ("<|im_start|>user\n<think>", ReasoningState.UNOPENED, ""),
    ],
)
def test_reasoning_state_scan(text, state, prefill):
    assert initial_reasoning_state(text, QWEN_RULES) == (state, prefill)


def test_no_reasoning_syntax():
    rules = PromptRules("<|im_start|>", "assistant\n", ("<|im_end|>",))
    assert initial_reasoning_state("<|im_start|>assistant\n<think>", rules) == (ReasoningState.NO_REASONING, "<think>")
    assert initial_reasoning_state("<|im_start|>user\n", rules) == (ReasoningState.NO_REASONING, "")


# --- prefix boundaries ------------------------------------------------------------------------


def test_stable_prefix_survives_the_next_turn(qwen):
    turn1 = [user("Hi"), {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}]
    first = qwen.build(turn1, add_generation_prompt=False)
    second = qwen.build([*turn1, user("More")])
    # The assistant reply loses its reasoning once a later user turn exists ...
    assert second.token_ids[: len(first.token_ids)] != first.token_ids
    # ... so only the user turn was declared stable, and that prefix is reused exactly.
    assert 0 < first.stable_prefix_len < len(first.token_ids)
    assert second.token_ids[: first.stable_prefix_len] == first.token_ids[: first.stable_prefix_len]
    # With a later user turn all three messages are stable.
    assert second.stable_prefix_len > first.stable_prefix_len
    third = qwen.build([*turn1, user("More"), {"role": "assistant", "content": "x"}, user("y")])
    assert third.token_ids[: second.stable_prefix_len] == second.token_ids[: second.stable_prefix_len]


def test_changes_when_last_stops_the_stable_prefix(deepseek):
    call = {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "call_2"}]}
    one_result = [user("Weather?"), call, {"role": "tool", "tool_call_id": "call_1", "content": "a"}]
    two_results = [*one_result, {"role": "tool", "tool_call_id": "call_2", "content": "b"}]
    first = deepseek.build(one_result, add_generation_prompt=False)
    second = deepseek.build(two_results, add_generation_prompt=False)
    assert not second.text.startswith(first.text)  # the outputs-end marker moved
    assert second.token_ids[: first.stable_prefix_len] == first.token_ids[: first.stable_prefix_len]
    assert first.stable_prefix_len < len(first.token_ids)


def test_rules_without_boundaries_accept_every_role_and_declare_nothing(qwen_tokenizer):
    rules = PromptRules("<|im_start|>", "assistant\n", ("<|im_end|>",))
    builder = PromptBuilder(ChatTemplate(QWEN_STYLE), qwen_tokenizer, rules)
    prompt = builder.build([{"role": "developer", "content": "d"}, user("u")])
    assert prompt.stable_prefix_len == 0
    assert "developer" not in prompt.text  # the template above renders only system turns up front


def test_from_contract():
    from helios.contract import serving_pb2 as spb

    frontend = spb.FrontendContract(
        reasoning_parser=spb.REASONING_PARSER_THINK_TAGS,
        reasoning_syntax=spb.ReasoningSyntax(open="<think>", close="</think>", terminal_markers=["<tool_call>"]),
        assistant_boundary=spb.AssistantBoundary(
            message_start="<|im_start|>", message_end="<|im_end|>", assistant_header="assistant\n"
        ),
        prefix_boundaries=[
            spb.PrefixBoundaryRule(role=spb.MESSAGE_ROLE_SYSTEM, constraint=spb.PREFIX_CONSTRAINT_STABLE),
            spb.PrefixBoundaryRule(role=spb.MESSAGE_ROLE_USER, constraint=spb.PREFIX_CONSTRAINT_STABLE),
            spb.PrefixBoundaryRule(
                role=spb.MESSAGE_ROLE_ASSISTANT, constraint=spb.PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN
            ),
            spb.PrefixBoundaryRule(role=spb.MESSAGE_ROLE_TOOL, constraint=spb.PREFIX_CONSTRAINT_STABLE),
        ],
    )
    assert PromptRules.from_contract(frontend) == QWEN_RULES


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hi",
        [{"role": "robot", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": 3}],
        [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": "x", "tool_calls": []}],
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}],
        [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}],
        [{"role": "assistant", "tool_calls": [{"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        [user("x"), {"role": "tool", "tool_call_id": "call_1", "content": "orphan"}],
        [{"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "other", "content": "x"}],
    ],
)
def test_bad_messages_are_request_errors(qwen, messages):
    with pytest.raises(MessageError) as info:
        qwen.build(messages)
    assert isinstance(info.value, RequestError) and info.value.http_status == 400


@pytest.mark.parametrize(
    "tools",
    [
        {"type": "function"},
        [{"type": "function", "function": {"name": ""}}],
        [{"type": "function", "function": {"name": "x" * 65}}],
        [{"type": "retrieval", "function": {"name": "f"}}],
        [{"type": "function", "function": {"name": "f", "parameters": []}}],
        [WEATHER_TOOL, WEATHER_TOOL],
    ],
)
def test_bad_tools_are_request_errors(tools):
    with pytest.raises(MessageError):
        parse_tools(tools)


def test_template_raise_exception_is_a_render_error(qwen):
    with pytest.raises(TemplateRenderError, match="System messages must come first"):
        qwen.build([user("a"), {"role": "system", "content": "late"}])


@pytest.mark.parametrize(
    "kwargs",
    [{"messages": 1}, {"add_generation_prompt": True}, {"bos_token": "x"}, {"x": [1]}, {"not an id": 1}, ["x"]],
)
def test_bad_template_kwargs(kwargs):
    template = ChatTemplate("{{ messages[0].content }}", {"bos_token": "<s>"})
    with pytest.raises(TemplateRenderError):
        template.render([user("a")], template_kwargs=kwargs)


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'system'}) }}",
        "{{ undefined_thing.attr }}",
        "{{ messages[0].content + 1 }}",
    ],
)
def test_sandbox_blocks_escapes_and_mutation(source):
    with pytest.raises(TemplateRenderError):
        ChatTemplate(source).render([user("a")])


def test_template_compile_failure_is_a_load_error():
    with pytest.raises(TemplateLoadError) as info:
        ChatTemplate("{% for x in %}")
    assert isinstance(info.value, LoadError)
    with pytest.raises(TemplateLoadError):
        ChatTemplate("x", {"messages": "clash"})


def test_undeclared_role_is_rejected(qwen_tokenizer):
    rules = PromptRules(
        "<|im_start|>",
        "assistant\n",
        ("<|im_end|>",),
        prefix_boundaries={Role.USER: PrefixConstraint.STABLE, Role.ASSISTANT: PrefixConstraint.STABLE},
    )
    builder = PromptBuilder(ChatTemplate(QWEN_STYLE), qwen_tokenizer, rules)
    with pytest.raises(MessageError, match="renders no system"):
        builder.build([{"role": "system", "content": "s"}, user("u")])
    with pytest.raises(MessageError, match="renders no developer"):
        builder.build([{"role": "developer", "content": "s"}, user("u")])


def test_parsed_records_are_frozen():
    (message,) = parse_messages([{"role": "assistant", "content": "x", "tool_calls": [CALL]}])
    assert message.tool_calls[0].arguments == '{"city":  "Paris"}'
    with pytest.raises(AttributeError):
        message.content = "y"
