"""An output that ends inside a tool call (the output limit, a stop string, EOS): every family
returns no call for it and the call's text as content, streamed and not alike.

Before, the families disagreed: the JSON-call syntaxes returned the unparsed block as content; the
tag syntaxes (Qwen3-Coder, GLM, DSML, XTML, ATEM frames) streamed the call from its invocation tag
and closed it at the end with its values cut short (``{"city": "Pari"}``, a call a client would run);
harmony streamed the call at its header and ended it with ``{}`` arguments, its text lost. A call
whose own markup closed before the end (its invocation closer, its JSON object) stays a call.
"""

from __future__ import annotations

import json

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.syntax import JsonCallSyntax, OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import (
    FramePosition, FrameStart, OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters,
)
from helios.runtime.records.events import FinishReason

from ..served import deepseek_model, ids_of, qwen_model, run_output
from ..test_presentation import WEATHER, folded, parse_sse
from .golden import check_stream_invariants, control_feeds, run
from .tools import TOOLS

DS = "｜DSML｜"
HARMONY_IDS = {control: 1 + n for n, control in enumerate(S.example_harmony().controls)}
RECIPIENT_IDS = {"<|start|>": 101, "<|message|>": 102, "<|eom|>": 103}
ARGS = {"city": "Paris", "days": 3}
# (syntax, the output's text with one call; its header controls are tokens, the rest is text)
FAMILIES = {
    "hermes": (OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags(), S.example_hermes()),
               'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'),
    "mistral": (OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax("[TOOL_CALLS]", name_key="name",
                                                                        arguments_key="arguments")),
                'Hi [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]'),
    "llama": (OutputSyntax(R.NONE, T.JSON_CALLS, tools=JsonCallSyntax(name_key="name", arguments_key="parameters")),
              '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}'),
    "deepseek-v3": (OutputSyntax(R.NONE, T.JSON_CALLS, tools=S.example_deepseek_v3()),
                    "Hi <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "qwen-coder": (OutputSyntax(R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, S.example_think_tags("<tool_call>"),
                                S.example_qwen_coder()),
                   "Hi\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    "glm": (OutputSyntax(R.THINK_TAGS, T.GLM_ARGUMENTS, S.example_think_tags(), S.example_glm_arguments()),
            "Hi\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    "dsml": (OutputSyntax(R.THINK_TAGS, T.DSML, S.example_think_tags(f"<{DS}function_calls>"), S.example_dsml()),
             f'Hi\n\n<{DS}function_calls>\n<{DS}invoke name="get_weather">\n<{DS}parameter name="city" string="true">'
             f'Paris</{DS}parameter>\n<{DS}parameter name="days" string="false">3</{DS}parameter>\n</{DS}invoke>\n'
             f"</{DS}function_calls>"),
    "xtml": (OutputSyntax(R.XTML_THINK, T.XTML, S.example_xtml_think(), S.example_xtml()),
             'Hi\n<xtml:calls><xtml:call name="get_weather"><xtml:arg name="city">Paris</xtml:arg>'
             '<xtml:arg name="days">3</xtml:arg></xtml:call></xtml:calls>'),
    "harmony": (OutputSyntax(R.HARMONY_CHANNELS, T.HARMONY_CHANNELS, channels=S.example_harmony()),
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris", "days": 3}'),  # <|call|> is an EOS token: not fed
    "recipients": (OutputSyntax(R.RECIPIENT_HEADERS, T.ATEM_RECIPIENTS, frames=S.example_recipients()),
                   '<|start|>assistant to=functions.get_weather<|message|><atem:function_calls><atem:invoke '
                   'name="get_weather"><atem:parameter name="city">Paris</atem:parameter><atem:parameter name="days">'
                   "3</atem:parameter></atem:invoke></atem:function_calls><|eom|>"),
}
FRAME_BODY = "<|message|>"  # frame families: the call's text is the frame's body
OPENERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama": "{", "deepseek-v3": "<｜tool▁calls▁begin｜>",
           "qwen-coder": "<tool_call>", "glm": "<tool_call>", "dsml": f"<{DS}function_calls>", "xtml": "<xtml:calls>",
           "harmony": "<|message|>{", "recipients": "<atem:function_calls>"}


def _controls(name: str) -> dict[str, int]:
    return HARMONY_IDS if name == "harmony" else RECIPIENT_IDS if name == "recipients" else {}


def _feeds(name: str, text: str, size: int) -> list[tuple[int, str]]:
    """Header controls as their tokens, the other text in pieces of `size` characters."""
    return control_feeds(_controls(name), text, size)


def _cuts(name: str, text: str) -> list[int]:
    """Every end of `text` that does not split a control token."""
    inside = {at + k for control in _controls(name) for at in _starts(text, control) for k in range(1, len(control))}
    return [cut for cut in range(len(text) + 1) if cut not in inside]


def _starts(text: str, part: str) -> list[int]:
    return [at for at in range(len(text)) if text.startswith(part, at)]


def _parse(name: str, text: str, size: int):
    syntax = FAMILIES[name][0]
    start = OutputStart(frame=FrameStart(FramePosition.BOUNDARY)) if name in ("harmony", "recipients") \
        else OutputStart(ReasoningState.CLOSED)
    pipeline = OutputPipeline.create(syntax, TokenDelimiters(_controls(name)), OutputRequest(TOOLS, "c", start))
    outcome = run(pipeline, _feeds(name, text, size))
    check_stream_invariants(outcome.events, outcome.result, "c")
    return outcome.result


@pytest.mark.parametrize("name", FAMILIES)
def test_an_output_cut_inside_a_call_returns_its_text_not_a_call(name):
    text = FAMILIES[name][1]
    whole = _parse(name, text, 1)
    assert [(c.name, json.loads(c.arguments), c.complete) for c in whole.tool_calls] == [("get_weather", ARGS, True)]
    for cut in _cuts(name, text):
        result = _parse(name, text[:cut], 1)
        assert _parse(name, text[:cut], 10**6) == result  # chunking does not matter
        calls = [(c.name, json.loads(c.arguments)) for c in result.tool_calls]
        assert calls in ([], [("get_weather", ARGS)]), (cut, calls)  # never a call with its values cut short
        if calls:
            continue
        assert result.reasoning == ""
        opened = cut >= text.index(OPENERS[name]) + len(OPENERS[name])  # a block or call began
        if name in ("harmony", "recipients"):  # the frame's body, from its tool markup on
            body = text.find(FRAME_BODY) + len(FRAME_BODY)
            assert result.content == (text[body:cut] if opened else ""), cut
        else:
            assert result.content == text[:cut], cut  # the answer and the call's text, all of it
        if opened:  # reported
            kinds = [error.kind for error in result.errors]
            assert K.UNTERMINATED_CALL in kinds or K.MALFORMED_CALL in kinds, cut


def test_a_call_closed_before_the_cut_stays_a_call():
    name = "qwen-coder"
    text = FAMILIES[name][1]
    second = text[text.index("<tool_call>"):]
    cut = text + "\n" + second[:second.index("Paris")]
    result = _parse(name, cut, 3)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_weather", ARGS)]
    assert result.content == "Hi" + "\n" + second[:second.index("Paris")]  # the second block's text
    assert [error.kind for error in result.errors] == [K.UNTERMINATED_CALL]


# -- as a client reads it: streamed chunks and the JSON body, on served models ------------------


def _chat(model, **fields):
    from helios.server.schemas import ChatCompletionRequest

    body = {"model": model.served_id, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    return ChatCompletionRequest.model_validate({**body, **fields})


def _client_views(model, ids, reason, **fields):
    """(the stream as a client folds it, with its finish reason; the JSON body's message and reason)."""
    prepared = model.prepare_chat(_chat(model, stream=True, **fields), request_id="s")
    steps, final = run_output(prepared, ids, reason)
    presenter = prepared.new_stream()
    events = parse_sse(presenter.sse_start() + b"".join(presenter.sse_step(s) for s in steps)
                       + presenter.sse_finish(final))
    state = folded(events[:-1])
    body = model.prepare_chat(_chat(model, **fields), request_id="s").response_body(
        run_output(model.prepare_chat(_chat(model, **fields), request_id="s"), ids, reason)[1])
    return state, events[-2]["choices"][0]["finish_reason"], body["choices"][0]


def _agree(state, stream_reason, choice) -> list[dict]:
    """Checks that the stream and the JSON body say the same; returns the calls."""
    message = choice["message"]
    calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls", [])]
    assert state["content"] == (message["content"] or "")
    assert state["reasoning_content"] == message.get("reasoning_content", "")
    assert list(state["calls"].values()) == calls
    assert stream_reason == choice["finish_reason"]
    return calls


@pytest.mark.parametrize("family", ["qwen", "dsml"])
def test_streamed_and_json_agree_when_the_output_limit_cuts_a_call(family, qwen_tokenizer, deepseek_tokenizer):
    if family == "qwen":
        model, tokenizer = qwen_model(qwen_tokenizer), qwen_tokenizer
        answer = ids_of(tokenizer, "</think>", "\n\nSure.", FAMILIES["qwen-coder"][1][2:])
    else:
        model, tokenizer = deepseek_model(deepseek_tokenizer), deepseek_tokenizer
        answer = ids_of(tokenizer, "</think>", "Sure.", FAMILIES["dsml"][1][2:])
    for count in range(1, len(answer) + 1):
        state, reason, choice = _client_views(model, answer[:count], FinishReason.LENGTH)
        calls = _agree(state, reason, choice)
        assert reason == "length"
        assert all(json.loads(call["arguments"]) == ARGS for call in calls), count  # whole, or no call
        if not calls:  # the call's text, not lost
            shown = tokenizer.decode(answer[:count], skip_special_tokens=False).split("</think>", 1)[-1]
            assert state["content"] == shown.lstrip(), count


def test_a_stop_string_inside_a_call_returns_its_text(qwen_tokenizer):
    model = qwen_model(qwen_tokenizer)
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    answer = ids_of(qwen_tokenizer, "</think>", "\n\nSure.", FAMILIES["qwen-coder"][1][2:]) + [eos]
    state, reason, choice = _client_views(model, answer, FinishReason.CANCELLED, stop=["</parameter>"])
    assert _agree(state, reason, choice) == []  # was a get_weather call with {"city": "Paris"} and reason "stop"
    assert state["content"] == "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    assert reason == "stop"
