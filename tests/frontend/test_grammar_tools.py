"""Tool calls and structured answers under one llguidance grammar, per tool syntax, on real tokenizers.

Each case prepares a chat request through `FrontendModel.prepare_chat` and samples outputs from its
grammar: at every step either a random token the mask allows (seeded) or, now and then, a "guide"
(the tokens of a syntax spelling, a JSON delimiter or EOS) when the grammar accepts all of it, so
outputs end in a few dozen tokens yet cover every branch. Every output is then fed through the
request's own output path (`OutputPipeline` via `OutputProcessor`) and must parse without errors
into complete calls of callable tools with schema-valid JSON arguments, or into an answer valid
under the response schema. Syntaxes: Qwen Coder function tags (Qwen tokenizer, reasoning open),
DSML (DeepSeek tokenizer, reasoning closed), GLM argument tags (DeepSeek tokenizer, text markup,
reasoning open), XTML (trained BPE, text delimiters, reasoning not yet opened) and recipient frames
with ATEM calls (trained BPE, open header).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass

import numpy as np
import pytest

from helios.frontend.structured.grammar import PATTERN_PROBES, GrammarCompiler, GrammarError, parse_response_format
from helios.frontend.structured.grammar_frames import frames_lark
from helios.frontend.structured.grammar_json_calls import json_calls_lark
from helios.frontend.structured.grammar_lark import LarkRules, Piece, Speller, not_containing, search_regex, text_then
from helios.frontend.structured.grammar_tools import AnswerKind, CallPolicy, ToolSchema
from helios.frontend.structured.grammar_values import ValueStyle, safe_schema, string_pattern, without_strings
from helios.frontend.parsers import FramePosition, FrameStart, TokenDelimiters
from helios.frontend.parsers.calls import ValueFormat
from helios.frontend.decoding.syntax import JsonCallSyntax
from helios.frontend.preparation.request_options import ChatOptionError
from helios.frontend.session import FrontendModel
from helios.server.schemas import ChatCompletionRequest
from support.sweeps import swept

from .parsers.conftest import small_bpe
from .served import (
    DEEPSEEK_THINK, JSON_DEFAULTS, RECIPIENT_FRAMES, STABLE_ROLES, deepseek_model, dsml_frontend, ids_of,
    qwen_model, recipient_frontend, run_output, served_contract,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["celsius", "fahrenheit"]},
            "ratio": {"type": "number"},
            "hourly": {"type": "boolean"},
            "options": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "level": {"type": ["integer", "string"]},
        },
        "required": ["city"],
    }}},
    {"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": ANSWER}}
JSON_CLOSERS = ['"', '"}', "}", "]"]
JSON_CONTENT = [", ", "1", "true", "null", '{"answer": "', "\n", '{"']

# -- models -----------------------------------------------------------------------------------------

XTML_TEMPLATE = """
{%- for message in messages %}<|{{ message.role }}|>{{ message.content }}<|end|>{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
"""


def glm_frontend(deepseek_tokenizer) -> dict:
    frontend = dsml_frontend(deepseek_tokenizer)
    frontend["tool_parser"] = "TOOL_PARSER_GLM_ARGUMENT_TAGS"
    frontend["tool_syntax"] = {
        "opener": "<tool_call>", "closer": "</tool_call>", "tag_separator": "\n", "parameter_open": "<arg_key>",
        "name_end": "</arg_key>", "value_open": "<arg_value>", "parameter_close": "</arg_value>", "block_lead": "\n",
    }
    return frontend


def xtml_frontend() -> dict:
    return {
        "tool_parser": "TOOL_PARSER_XTML",
        "reasoning_parser": "REASONING_PARSER_XTML_THINK",
        "tool_syntax": {
            "opener": "<xtml:calls>", "closer": "</xtml:calls>", "invoke_open": '<xtml:call name="',
            "invoke_close": "</xtml:call>", "parameter_open": '<xtml:arg name="', "parameter_close": "</xtml:arg>",
            "name_end": '">', "block_lead": "\n",
        },
        "reasoning_syntax": {
            "open": "<xtml:think>", "close": "</xtml:think>", "terminal_markers": ["<xtml:calls>"],
            "wrapping_newlines": 1, "after_close": "\n",
        },
        "assistant_boundary": {"message_start": "", "message_end": "<|end|>", "assistant_header": "<|assistant|>"},
        "prefix_boundaries": STABLE_ROLES,
    }


@dataclass(frozen=True)
class Served:
    model: FrontendModel
    tokenizer: object
    eos: int
    closers: tuple[tuple[int, ...], ...]  # guides that can end free text: markup, JSON closers, EOS
    kwargs: dict

    @property
    def guides(self) -> tuple[tuple[int, ...], ...]:
        return self.closers + tuple(tuple(ids_of(self.tokenizer, text)) for text in JSON_CONTENT)


def closers_for(model: FrontendModel, tokenizer, eos: int, extra=()) -> tuple[tuple[int, ...], ...]:
    """Token sequences of the syntax's spellings, JSON closers and EOS."""
    output = model.syntax.output
    texts = list(JSON_CLOSERS) + list(extra)
    for data in (output.think, output.tools, output.frames, output.frames and output.frames.tools):
        if data:
            texts += [value for value in vars(data).values() if isinstance(value, str) and value.strip()]
    sequences = {tuple(ids_of(tokenizer, text)) for text in texts}
    return tuple(sorted(sequences | {(eos,)}))


def served_models(qwen_tokenizer, deepseek_tokenizer, names=("qwen", "dsml", "glm", "xtml", "atem")) -> dict:
    """The `Served` frontend of each syntax in `names`."""
    out = {}
    if "qwen" in names:
        qwen = qwen_model(qwen_tokenizer)
        eos = qwen_tokenizer.token_to_id("<|im_end|>")
        out["qwen"] = Served(qwen, qwen_tokenizer, eos, closers_for(qwen, qwen_tokenizer, eos), {})
    if "dsml" in names:
        dsml = deepseek_model(deepseek_tokenizer)
        out["dsml"] = Served(dsml, deepseek_tokenizer, 1, closers_for(dsml, deepseek_tokenizer, 1), {})
    if "glm" in names:
        bos = {"name": "bos_token", "text": "<｜begin▁of▁sentence｜>", "token_id": 0}
        contract = served_contract(deepseek_tokenizer.get_vocab_size(), glm_frontend(deepseek_tokenizer), [1], [bos])
        glm = FrontendModel.from_contract(contract, deepseek_tokenizer, DEEPSEEK_THINK, json_defaults=JSON_DEFAULTS)
        out["glm"] = Served(glm, deepseek_tokenizer, 1, closers_for(glm, deepseek_tokenizer, 1),
                            {"chat_template_kwargs": {"thinking": True}})
    if "xtml" in names:
        xtml_tokenizer = small_bpe(["<|endoftext|>"])
        eos = xtml_tokenizer.token_to_id("<|endoftext|>")
        contract = served_contract(xtml_tokenizer.get_vocab_size(), xtml_frontend(), [eos])
        xtml = FrontendModel.from_contract(contract, xtml_tokenizer, XTML_TEMPLATE, json_defaults=JSON_DEFAULTS)
        out["xtml"] = Served(xtml, xtml_tokenizer, eos, closers_for(xtml, xtml_tokenizer, eos, ["&lt;", "&amp;"]), {})
    if "atem" in names:
        out["atem"] = _frames_served()
    return out


@pytest.fixture(scope="module")
def served(qwen_tokenizer, deepseek_tokenizer):
    return served_models(qwen_tokenizer, deepseek_tokenizer)


def _frames_served() -> Served:
    frames_tokenizer = small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    eos = frames_tokenizer.token_to_id("<|endoftext|>")
    contract = served_contract(frames_tokenizer.get_vocab_size(), recipient_frontend(), [eos])
    frames = FrontendModel.from_contract(contract, frames_tokenizer, RECIPIENT_FRAMES, json_defaults=JSON_DEFAULTS)
    headers = [" to=self", " to=user", " to=functions", "assistant to=functions.get_weather"]
    return Served(frames, frames_tokenizer, eos, closers_for(frames, frames_tokenizer, eos, headers), {})


SYNTAXES = ["qwen", "dsml", "glm", "xtml", "atem"]
# Outputs sampled per syntax (structured answer or calls; forced calls). HELIOS_GRAMMAR_TOOLS_SWEEP=1
# samples 100 and 20 as before: the default counts already take every syntax's grammar and parser
# paths (each branch is asserted seen), with the same seeds.
STRUCTURED_SAMPLES, FORCED_SAMPLES = (100, 20) if swept("HELIOS_GRAMMAR_TOOLS_SWEEP") else (50, 10)
# Forced calls sampled per syntax with nullable string parameters: 12 by default (each syntax writes text
# and null where the assertions below ask, with the same seed), 24 with HELIOS_GRAMMAR_TOOLS_SWEEP=1.
NULLABLE_SAMPLES = 24 if swept("HELIOS_GRAMMAR_TOOLS_SWEEP") else 12


def chat(served: Served, **fields) -> ChatCompletionRequest:
    body = {"model": served.model.served_id, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    body.update(served.kwargs)
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


# -- sampling -----------------------------------------------------------------------------------------


def is_allowed(mask: np.ndarray, token_id: int) -> bool:
    return bool((int(mask[token_id // 32]) >> (token_id % 32)) & 1)


def random_allowed(mask: np.ndarray, rng: np.random.Generator) -> int:
    words = mask.view(np.uint32)
    counts = np.cumsum(np.bitwise_count(words))
    pick = int(rng.integers(counts[-1]))
    word = int(np.searchsorted(counts, pick, side="right"))
    rank = pick - (int(counts[word - 1]) if word else 0)
    bits = [j for j in range(32) if (int(words[word]) >> j) & 1]
    return 32 * word + bits[rank]


def allowed_count(mask: np.ndarray) -> int:
    return int(np.bitwise_count(mask.view(np.uint32)).sum())


def is_free(mask: np.ndarray, served: Served) -> bool:
    """Free text (reasoning, raw values, JSON strings): most of the vocabulary is allowed."""
    return allowed_count(mask) > served.tokenizer.get_vocab_size() // 2


def guided(matcher, mask: np.ndarray, served: Served, rng: np.random.Generator) -> list[int] | None:
    """EOS (when allowed, probability 1/2), or a guide the grammar accepts whole; in free text only
    a closer after which the allowed tokens change (it ends the text)."""
    if is_allowed(mask, served.eos) and rng.random() < 0.5:
        return [served.eos]
    free = is_free(mask, served)
    guides = served.closers if free else served.guides
    for index in rng.permutation(len(guides)):
        guide = guides[index]
        if not is_allowed(mask, guide[0]):
            continue
        probe = matcher.fork()
        if all(probe.consume_token(t) for t in guide) and not (free and np.array_equal(probe.bitmask(), mask)):
            return list(guide)
    return None


def sample_until_eos(matcher, served: Served, rng: np.random.Generator, max_tokens: int) -> tuple[list[int], bool]:
    """Random allowed tokens, or (probability 1/2) a guide, up to EOS or `max_tokens`: (the ids,
    whether EOS ended them)."""
    ids: list[int] = []
    while len(ids) < max_tokens:
        mask = matcher.bitmask()
        step = guided(matcher, mask, served, rng) if rng.random() < 0.5 else None
        for token_id in step or [random_allowed(mask, rng)]:
            assert matcher.consume_token(token_id), matcher.error
            ids.append(token_id)
            if token_id == served.eos:
                return ids, True
    return ids, False


def sample(matcher, served: Served, rng: np.random.Generator, max_tokens: int = 400) -> list[int]:
    """One output ending at EOS: random allowed tokens, or (probability 1/2) a guide."""
    ids, ended = sample_until_eos(matcher, served, rng, max_tokens)
    if not ended:
        text = served.tokenizer.decode(ids, skip_special_tokens=False)
        raise AssertionError(f"no EOS within {max_tokens} tokens: {text!r}")
    return ids


# -- checks -------------------------------------------------------------------------------------------

PYTHON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def validate(value, schema) -> list[str]:
    """The JSON-schema keywords used here; returns the violations."""
    if "anyOf" in schema:
        return [] if any(not validate(value, s) for s in schema["anyOf"]) else [f"{value!r}: no anyOf branch"]
    if isinstance(schema.get("type"), list):
        branches = [{**schema, "type": kind} for kind in schema["type"]]
        return [] if any(not validate(value, s) for s in branches) else [f"{value!r} is none of {schema['type']}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    kind = schema.get("type")
    if kind in ("integer", "number"):
        numeric = int if kind == "integer" else (int, float)
        if not isinstance(value, numeric) or isinstance(value, bool):
            return [f"{value!r} is not {kind}"]
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            errors.append(f"{value} out of range")
    elif kind is not None and type(value) is not PYTHON_TYPES[kind]:
        return [f"{value!r} is not {kind}"]
    if kind == "string" and len(value) > schema.get("maxLength", len(value)):
        errors.append(f"{value!r} too long")
    if kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            errors.append("too many items")
        errors += [e for item in value for e in validate(item, schema.get("items", {}))]
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"missing {key}" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties", True) is False:
            errors += [f"extra {key}" for key in value if key not in properties]
        errors += [e for key, item in value.items() if key in properties for e in validate(item, properties[key])]
    return errors


def check(result, *, callable_names, answer: AnswerKind, single: bool) -> str:
    """Validates one parsed output; returns "calls" or "answer"."""
    assert result.errors == (), result
    if result.tool_calls:
        assert not single or len(result.tool_calls) == 1, result.tool_calls
        for call in result.tool_calls:
            assert call.complete and call.name in callable_names, call
            arguments = json.loads(call.arguments)
            assert validate(arguments, SCHEMAS[call.name]) == [], (call, arguments)
        if answer is not AnswerKind.FREE:
            assert result.content == "", result
        return "calls"
    assert answer is not AnswerKind.NONE, result
    if answer is AnswerKind.STRUCTURED:
        assert validate(json.loads(result.content), ANSWER) == [], result.content
    return "answer"


def run_samples(served: Served, prepared, count: int, seed: int, **expect) -> dict:
    rng = np.random.default_rng(seed)
    seen = {"calls": 0, "answer": 0, "reasoning": 0, "names": set()}
    for _ in range(count):
        ids = sample(prepared.grammar.fork(), served, rng)
        _, final = run_output(prepared, ids)
        seen[check(final.result, **expect)] += 1
        seen["reasoning"] += bool(final.result.reasoning)
        seen["names"] |= {call.name for call in final.result.tool_calls}
    return seen


# -- random outputs per syntax ------------------------------------------------------------------------


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_structured_answer_or_registered_calls(served, syntax):
    case = served[syntax]
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, response_format=RESPONSE_FORMAT))
    assert prepared.params.is_constrained
    seen = run_samples(case, prepared, STRUCTURED_SAMPLES, seed=len(syntax), callable_names=set(SCHEMAS),
                       answer=AnswerKind.STRUCTURED, single=False)
    assert seen["calls"] and seen["answer"]
    assert seen["names"] == set(SCHEMAS)
    assert seen["reasoning"] or syntax == "dsml"  # the DeepSeek prompt closes reasoning


def test_recipient_frames_without_tools_constrain_the_visible_answer(served):
    case = served["atem"]
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, tool_choice="none", response_format=RESPONSE_FORMAT))
    seen = run_samples(case, prepared, 30, seed=4, callable_names=set(), answer=AnswerKind.STRUCTURED, single=False)
    assert seen["answer"] == 30 and seen["reasoning"]


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_required_and_named_tool_choice_always_call(served, syntax):
    case = served[syntax]
    required = case.model.prepare_chat(chat(case, tools=TOOLS, tool_choice="required"))
    seen = run_samples(case, required, FORCED_SAMPLES, seed=1, callable_names=set(SCHEMAS), answer=AnswerKind.NONE,
                       single=False)
    assert seen["calls"] == FORCED_SAMPLES
    named = {"type": "function", "function": {"name": "write_file"}}
    forced = case.model.prepare_chat(chat(case, tools=TOOLS, tool_choice=named, response_format=RESPONSE_FORMAT))
    seen = run_samples(case, forced, FORCED_SAMPLES, seed=2, callable_names={"write_file"}, answer=AnswerKind.NONE,
                       single=True)
    assert seen["calls"] == FORCED_SAMPLES and seen["names"] == {"write_file"}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_parallel_tool_calls_false_allows_at_most_one_call(served, syntax):
    case = served[syntax]
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, parallel_tool_calls=False))
    seen = run_samples(case, prepared, 30, seed=3, callable_names=set(SCHEMAS), answer=AnswerKind.FREE, single=True)
    assert seen["calls"] and seen["answer"]


# -- fixed outputs ------------------------------------------------------------------------------------

TEXT_FORMAT = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
    "type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"], "additionalProperties": False}}}


def plain_ids(tokenizer, text: str) -> list[int]:
    """``text`` as ordinary tokens, one character at a time (markup never becomes its added token)."""
    return [i for char in text for i in tokenizer.encode(char, add_special_tokens=False).ids]


def accepts(matcher, ids) -> bool:
    probe = matcher.fork()
    return all(probe.consume_token(token_id) for token_id in ids)


def drive(prepared, ids):
    """Consumes ``ids`` through the request's grammar (all must be accepted), then parses them."""
    matcher = prepared.grammar.fork()
    for token_id in ids:
        assert matcher.consume_token(token_id), matcher.error
    assert matcher.is_stopped
    return run_output(prepared, ids)[1].result


LITERAL_ANSWERS = {
    "qwen": (["ok", "</think>", "\n\n"], '{"t": "<tool_call> </think> <function=get_time>"}'),
    "dsml": ([], '{"t": "<｜DSML｜function_calls> </think>"}'),
    "glm": (["ok", "</think>"], '{"t": "<tool_call>get_time</tool_call>"}'),
    "xtml": ([], '{"t": "<xtml:calls><xtml:call name=\\"get_time\\"></xtml:call></xtml:calls>"}'),
    "atem": ([" to=user<|message|>"], '{"t": "<|start|>assistant to=functions<|message|>"}'),
}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_literal_tags_inside_a_structured_answer_stay_answer_text(served, syntax):
    case = served[syntax]
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, response_format=TEXT_FORMAT))
    lead, answer = LITERAL_ANSWERS[syntax]
    result = drive(prepared, ids_of(case.tokenizer, *lead) + plain_ids(case.tokenizer, answer) + [case.eos])
    assert (result.content, result.tool_calls, result.errors) == (answer, (), ())


def test_qwen_masks_force_the_named_function_and_a_single_call(served):
    case = served["qwen"]
    tokenizer = case.tokenizer
    named = {"type": "function", "function": {"name": "get_time"}}
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, tool_choice=named))
    head = ids_of(tokenizer, "</think>", "\n\n", "<tool_call>", "\n<function=")
    assert accepts(prepared.grammar, head + ids_of(tokenizer, "get_time>"))
    assert not accepts(prepared.grammar, head + ids_of(tokenizer, "get_weather>"))
    assert not accepts(prepared.grammar, ids_of(tokenizer, "</think>", "Sure."))  # no answer
    call = ids_of(tokenizer, "<tool_call>", "\n<function=get_time>\n</function>\n", "</tool_call>")
    single = case.model.prepare_chat(chat(case, tools=TOOLS, parallel_tool_calls=False))
    matcher = single.grammar.fork()
    assert all(matcher.consume_token(t) for t in ids_of(tokenizer, "</think>", "Sure.\n\n") + call)
    mask = matcher.bitmask()
    assert is_allowed(mask, case.eos) and not is_allowed(mask, ids_of(tokenizer, "<tool_call>")[0])
    result = drive(single, ids_of(tokenizer, "</think>", "Sure.\n\n") + call + [case.eos])
    assert result.content == "Sure." and [c.name for c in result.tool_calls] == ["get_time"]


def test_recipient_frames_force_registered_and_named_recipients(served):
    case = served["atem"]
    tokenizer = case.tokenizer
    named = {"type": "function", "function": {"name": "get_time"}}
    prepared = case.model.prepare_chat(chat(case, tools=TOOLS, tool_choice=named, response_format=RESPONSE_FORMAT))
    assert accepts(prepared.grammar, ids_of(tokenizer, " to=functions.get_time<|message|>"))
    assert not accepts(prepared.grammar, ids_of(tokenizer, " to=functions.get_weather<|message|>"))
    assert not accepts(prepared.grammar, ids_of(tokenizer, " to=user<|message|>"))
    generic = ids_of(tokenizer, " to=functions<|message|><atem:function_calls>\n<atem:invoke name=\"")
    assert accepts(prepared.grammar, generic + ids_of(tokenizer, 'get_time">'))
    assert not accepts(prepared.grammar, generic + ids_of(tokenizer, 'write_file">'))
    reasoning = ids_of(tokenizer, " to=self<|message|>Plan.<|eom|>")
    call = ids_of(tokenizer, '<|start|>assistant to=functions.get_time<|message|><atem:function_calls>\n'
                             '<atem:invoke name="get_time">\n</atem:invoke>\n</atem:function_calls><|eom|>')
    result = drive(prepared, reasoning + call + [case.eos])
    assert result.reasoning == "Plan." and [c.name for c in result.tool_calls] == ["get_time"]


def test_json_values_never_close_early(served):
    qwen = served["qwen"]
    prepared = qwen.model.prepare_chat(chat(qwen, tools=TOOLS, tool_choice="required"))
    head = ids_of(qwen.tokenizer, "</think>", "<tool_call>", "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "<parameter=options>\n")
    assert accepts(prepared.grammar, head + plain_ids(qwen.tokenizer, '{"a": "</p>"}'))
    assert not accepts(prepared.grammar, head + plain_ids(qwen.tokenizer, '{"a": "</parameter>'))
    assert not accepts(prepared.grammar, head + plain_ids(qwen.tokenizer, '{"a": 1e999'))
    xtml = served["xtml"]
    prepared = xtml.model.prepare_chat(chat(xtml, tools=TOOLS, tool_choice="required"))
    head = ids_of(xtml.tokenizer, '<xtml:calls>\n<xtml:call name="get_weather">\n<xtml:arg name="city">a &lt; b</xtml:arg>\n'
                  '<xtml:arg name="options">')
    assert not accepts(prepared.grammar, head + plain_ids(xtml.tokenizer, '{"a": "&quot;'))
    assert not accepts(prepared.grammar, head + plain_ids(xtml.tokenizer, '{"a": "<'))
    tail = plain_ids(xtml.tokenizer, '{"a&amp;b": "&lt;i&gt;"}') + ids_of(xtml.tokenizer, "</xtml:arg>\n</xtml:call>\n</xtml:calls>")
    result = drive(prepared, head + tail + [xtml.eos])
    assert [json.loads(c.arguments) for c in result.tool_calls] == [{"city": "a < b", "options": {"a&b": "<i>"}}]


# -- options that cannot be honoured ------------------------------------------------------------------


@pytest.fixture(scope="module")
def toolless():
    """A model whose output syntax has no tool calls (and no reasoning)."""
    tokenizer = small_bpe(["<|endoftext|>"])
    frontend = {
        "tool_parser": "TOOL_PARSER_NONE", "reasoning_parser": "REASONING_PARSER_NONE",
        "assistant_boundary": {"message_start": "", "message_end": "<|end|>", "assistant_header": "<|assistant|>"},
        "prefix_boundaries": STABLE_ROLES,
    }
    contract = served_contract(tokenizer.get_vocab_size(), frontend, [tokenizer.token_to_id("<|endoftext|>")])
    model = FrontendModel.from_contract(contract, tokenizer, XTML_TEMPLATE, json_defaults=JSON_DEFAULTS)
    return Served(model, tokenizer, tokenizer.token_to_id("<|endoftext|>"), (), {})


def test_forcing_calls_without_a_tool_syntax_is_a_400(toolless):
    for fields in ({"tool_choice": "required"}, {"parallel_tool_calls": False},
                   {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}):
        with pytest.raises(ChatOptionError, match="no tool calls") as caught:
            toolless.model.prepare_chat(chat(toolless, tools=TOOLS, **fields))
        assert caught.value.http_status == 400
    answer_only = toolless.model.prepare_chat(chat(toolless, tools=TOOLS, response_format=TEXT_FORMAT))
    assert accepts(answer_only.grammar, plain_ids(toolless.tokenizer, '{"t": "x"}') + [toolless.eos])


def test_invalid_answer_and_tool_grammars_are_400s_naming_the_part(served):
    case = served["qwen"]
    bad = {"type": "regex", "regex": "(unclosed"}
    for fields in ({"tool_choice": "required"}, {}):
        with pytest.raises(GrammarError, match="regex"):
            case.model.prepare_chat(chat(case, tools=TOOLS, response_format=bad, **fields))
    lookaround = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "(?=x)"}}}}}}
    with pytest.raises(GrammarError, match="tool 'f' parameters: .*look-around") as caught:
        case.model.prepare_chat(chat(case, tools=[lookaround], tool_choice="required"))
    assert caught.value.http_status == 400



def test_many_tools_share_one_cached_verdict_and_one_pattern_bound(served, monkeypatch):
    case = served["qwen"]
    compiler = case.model._constraints._compiler
    probed, probe = [], compiler._probe
    monkeypatch.setattr(compiler, "_probe", lambda request: probed.append(request) or probe(request))
    tools = [{"type": "function", "function": {"name": f"bound{i}", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": f"^a{i}[a-z]+$"}, "b": {"type": "string", "pattern": f"^b{i}[0-9]+$"}}}}}
             for i in range(128)]
    case.model.prepare_chat(chat(case, tools=tools, tool_choice="required"))
    assert len(probed) == 128 + PATTERN_PROBES  # each tool's grammar, then the patterns of all of them up to the bound
    case.model.prepare_chat(chat(case, tools=tools, tool_choice="required"))
    assert len(probed) == 128 + PATTERN_PROBES  # the same tools again: one cache hit
    bad = [*tools[:5], tool({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}), *tools[6:]]
    with pytest.raises(GrammarError, match="tool 'f' parameters: .*regex parse error"):
        case.model.prepare_chat(chat(case, tools=bad, tool_choice="required"))
    vendor = {"type": "object", "properties": {"a": {"type": "string", "not": {"pattern": "(?!x)"}}},
              "x-ui": {"pattern": "(("}}
    assert case.model.prepare_chat(chat(case, tools=[tool(vendor)], tool_choice="required")).grammar is not None


def tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def with_property(schema: dict) -> dict:
    return {"type": "object", "properties": {"a": schema}, "required": ["a"]}


BAD_PARAMETERS = {
    "top-level string": ({"type": "string"}, 'type \\"object\\", not "string"'),
    "unknown top-level type": ({"type": "bogus"}, 'type \\"object\\", not "bogus"'),
    "unknown property type": (with_property({"type": "bogus"}), "Invalid type: bogus"),
    "invalid pattern": (with_property({"type": "string", "pattern": "(("}), "regex parse error"),
    "pattern past the lexer limits": (with_property({"type": "string", "pattern": "^a{100000}$"}),
                                      "exceeds llguidance's limits"),
    "optional pattern past the lexer limits": (
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a{100000}$"}}},
        "exceeds llguidance's limits"),
}
FORCING = {"required": {"tool_choice": "required"},
           "named": {"tool_choice": {"type": "function", "function": {"name": "f"}}},
           "auto with a response format": {"response_format": {"type": "json_object"}}}


@pytest.mark.parametrize("syntax", ["qwen", "dsml"])
@pytest.mark.parametrize("bad", list(BAD_PARAMETERS))
def test_a_tool_schema_that_cannot_constrain_its_arguments_is_a_400_naming_the_tool(served, syntax, bad):
    case = served[syntax]
    parameters, reason = BAD_PARAMETERS[bad]
    for fields in FORCING.values():
        with pytest.raises(GrammarError, match=f"tool 'f' parameters: .*{reason}") as caught:
            case.model.prepare_chat(chat(case, tools=[tool(parameters), *TOOLS], **fields))
        assert caught.value.http_status == 400
    unconstrained = case.model.prepare_chat(chat(case, tools=[tool(parameters)]))  # auto, no grammar: not checked
    assert unconstrained.grammar is None


def test_unsupported_schema_keywords_stay_lenient_in_tool_schemas(served):
    case = served["qwen"]
    parameters = {"type": "object", "if": {"required": ["a"]}, "then": {}, "properties": {
        "a": {"type": "string", "format": "no-such-format"},
        "b": {"type": "array", "contains": {"type": "integer"}, "minContains": 2}}}
    for fields in FORCING.values():
        assert case.model.prepare_chat(chat(case, tools=[tool(parameters)], **fields)).grammar is not None
    untyped = case.model.prepare_chat(chat(case, tools=[tool({"properties": {"a": {}}})], tool_choice="required"))
    assert untyped.grammar is not None  # no top-level type: an object schema, as before


# -- raw string bounds ---------------------------------------------------------------------------------

BOUNDED = {"type": "function", "function": {"name": "label", "parameters": {
    "type": "object",
    "properties": {
        "code": {"type": "string", "maxLength": 5},
        "word": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"},
        "tag": {"type": "string", "pattern": "^x"},
    },
    "required": ["code", "word", "tag"],
}}}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_raw_string_values_keep_their_length_and_pattern(served, syntax):
    """Plain string parameters are raw text in these syntaxes: their minLength, maxLength and pattern
    (unanchored where it spells no ^/$) hold for the value the parser reads (they were dropped)."""
    case = served[syntax]
    if syntax == "qwen":  # a bounded value ends with its wrap: a guide that closes it
        case = dataclasses.replace(case, closers=(*case.closers, tuple(ids_of(case.tokenizer, "\n</parameter>"))))
    prepared = case.model.prepare_chat(chat(case, tools=[BOUNDED], tool_choice="required", parallel_tool_calls=False))
    rng = np.random.default_rng(7)
    for _ in range(12):
        result = run_output(prepared, sample(prepared.grammar.fork(), case, rng))[1].result
        assert result.errors == () and result.tool_calls, result
        for call in result.tool_calls:
            arguments = json.loads(call.arguments)
            assert len(arguments["code"]) <= 5, arguments
            assert re.fullmatch("[a-z]{2,4}", arguments["word"]), arguments
            assert arguments["tag"].startswith("x"), arguments


def test_a_bounded_qwen_value_is_read_exactly_and_cannot_hold_its_closer(served):
    case = served["qwen"]
    tokenizer = case.tokenizer
    parameters = BOUNDED["function"]["parameters"]
    bounded = {**parameters, "properties": {**parameters["properties"], "tag": {"type": "string", "pattern": "^x|yz$"}}}
    prepared = case.model.prepare_chat(chat(case, tools=[{"type": "function", "function": {
        "name": "label", "parameters": bounded}}], tool_choice="required"))
    head = ids_of(tokenizer, "</think>", "<tool_call>", "\n<function=label>\n<parameter=code>\n")

    def value(text: str) -> list[int]:
        return head + plain_ids(tokenizer, text) + ids_of(tokenizer, "\n</parameter>\n")

    assert accepts(prepared.grammar, value("a\nb c"))
    assert not accepts(prepared.grammar, value("abcdef"))
    assert not accepts(prepared.grammar, head + plain_ids(tokenizer, "a</parameter>b\n</parameter>"))
    word = value("ab") + ids_of(tokenizer, "<parameter=word>\n")
    assert accepts(prepared.grammar, word + plain_ids(tokenizer, "abcd\n</parameter>"))
    assert not accepts(prepared.grammar, word + plain_ids(tokenizer, "a\n</parameter>"))
    assert not accepts(prepared.grammar, word + plain_ids(tokenizer, "aBc\n</parameter>"))
    assert not accepts(prepared.grammar, word + plain_ids(tokenizer, "ab</parameter>cd\n</parameter>"))
    tag = word + plain_ids(tokenizer, "abc\n</parameter>\n") + ids_of(tokenizer, "<parameter=tag>\n")
    assert not accepts(prepared.grammar, tag + plain_ids(tokenizer, "ayz \n</parameter>"))
    ids = tag + plain_ids(tokenizer, "\nzyz\n</parameter>\n</function>\n") + ids_of(tokenizer, "</tool_call>")
    result = drive(prepared, ids + [case.eos])
    assert [json.loads(c.arguments) for c in result.tool_calls] == [{"code": "ab", "word": "abc", "tag": "\nzyz"}]


NULLABLE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object",
    "properties": {
        "text": {"type": ["string", "null"]},  # pydantic's Optional[str]
        "code": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
        "tag": {"$ref": "#/$defs/tag"},
    },
    "required": ["text", "code", "tag"],
    "$defs": {"tag": {"oneOf": [{"type": "null"}, {"type": "string", "pattern": "^x"}]}},
}}}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_nullable_string_parameters_take_text_or_null(served, syntax):
    """A nullable plain string is raw text or null in a forced call, its string branch's bounds
    held (only null could be written: the grammar kept the schema's non-string part)."""
    case = served[syntax]
    if syntax == "qwen":  # a bounded value ends with its wrap: a guide that closes it
        case = dataclasses.replace(case, closers=(*case.closers, tuple(ids_of(case.tokenizer, "\n</parameter>"))))
    prepared = case.model.prepare_chat(chat(case, tools=[NULLABLE], tool_choice="required", parallel_tool_calls=False))
    rng = np.random.default_rng(11)
    seen = {"text": set(), "code": set(), "tag": set()}
    for _ in range(NULLABLE_SAMPLES):
        result = run_output(prepared, sample(prepared.grammar.fork(), case, rng))[1].result
        assert result.errors == () and result.tool_calls, result
        for call in result.tool_calls:
            arguments = json.loads(call.arguments)
            assert arguments["code"] is None or (isinstance(arguments["code"], str) and len(arguments["code"]) <= 3)
            assert arguments["tag"] is None or arguments["tag"].startswith("x"), arguments
            assert arguments["text"] is None or isinstance(arguments["text"], str), arguments
            for key in seen:
                seen[key].add(arguments[key] is None)
    # random tokens rarely spell "null" where any short text may stand: those nulls are read in the
    # qwen test below; a pattern narrows the text, so null comes up
    assert seen["tag"] == {True, False} and False in seen["text"] and False in seen["code"], seen


def test_a_nullable_qwen_value_reads_as_text_or_null(served):
    case = served["qwen"]
    tokenizer = case.tokenizer
    prepared = case.model.prepare_chat(chat(case, tools=[NULLABLE], tool_choice="required"))
    head = ids_of(tokenizer, "</think>", "<tool_call>", "\n<function=note>\n<parameter=text>\n")
    closer = ids_of(tokenizer, "\n</parameter>\n")

    def param(name: str, text: str) -> list[int]:
        return ids_of(tokenizer, f"<parameter={name}>\n") + plain_ids(tokenizer, text) + closer

    text = head + plain_ids(tokenizer, "hello world") + closer
    assert accepts(prepared.grammar, text + param("code", "abc"))
    assert accepts(prepared.grammar, text + param("code", "null"))
    assert not accepts(prepared.grammar, text + param("code", "abcd"))
    ids = text + param("code", "null") + param("tag", "xy") + ids_of(tokenizer, "</function>\n", "</tool_call>")
    result = drive(prepared, ids + [case.eos])
    assert [json.loads(c.arguments) for c in result.tool_calls] == [{"text": "hello world", "code": None, "tag": "xy"}]
    ids = head + plain_ids(tokenizer, "null") + closer + param("code", "ab") + param("tag", "null")
    result = drive(prepared, ids + ids_of(tokenizer, "</function>\n", "</tool_call>") + [case.eos])
    assert [json.loads(c.arguments) for c in result.tool_calls] == [{"text": None, "code": "ab", "tag": None}]


@pytest.mark.parametrize("schema, reason", [
    ({"type": "string", "pattern": "(^a)"}, "takes \\^ and \\$ only at the ends"),
    ({"type": "string", "minLength": 1, "maxLength": 5000}, "above 1000"),
])
def test_raw_string_bounds_the_grammar_cannot_enforce_are_400s_naming_the_parameter(served, schema, reason):
    case = served["qwen"]
    with pytest.raises(GrammarError, match=f"tool 'f' parameter 'a': .*{reason}") as caught:
        case.model.prepare_chat(chat(case, tools=[tool(with_property(schema))], tool_choice="required"))
    assert caught.value.param == "tools[0].function.parameters.properties.a"
    long = case.model.prepare_chat(chat(case, tools=[tool(with_property({"type": "string", "maxLength": 100000}))],
                                        tool_choice="required"))
    assert long.grammar is not None  # a maxLength alone has no limit


def test_json_call_arguments_ignore_keywords_llguidance_lacks_and_keep_the_rest(served):
    """Like the tag syntaxes (and the check of the tool's schema), JSON calls compile tool schemas
    leniently: an unknown format is ignored (it failed to compile, a 400), maxLength still holds."""
    case = served["qwen"]
    compiler, speller = case.model._constraints._compiler, case.model._constraints._speller
    syntax = JsonCallSyntax(block_open="<tool_call>", block_close="</tool_call>", name_key="name",
                            arguments_key="arguments")
    schema = with_property({"type": "string", "format": "no-such-format", "maxLength": 3})
    matcher = compiler.compile_lark(json_calls_lark(syntax, speller, [ToolSchema("f", schema)], True, {}), None)
    call = ids_of(case.tokenizer, "<tool_call>", '\n{"name": "f", "arguments": {"a": "')
    assert accepts(matcher, call + plain_ids(case.tokenizer, 'abc"'))
    assert not accepts(matcher, call + plain_ids(case.tokenizer, "abcd"))


@pytest.mark.parametrize("pattern", ["ab", "^ab", "ab$", "^ab$", "^a|b$", "a$|^b", "[$^]x", "\\$", "^(a|b)$", "^$", "a|"])
def test_search_regex_matches_where_the_pattern_finds_a_match(pattern):
    full = re.compile(search_regex(pattern))
    rng = random.Random(pattern)
    for _ in range(500):
        text = "".join(rng.choice("ab$^x") for _ in range(rng.randrange(6)))  # no newline: $ is the end alone
        assert (full.fullmatch(text) is not None) == (re.search(pattern, text) is not None), (pattern, text)
    assert search_regex("(^a)") is None and search_regex("a(b$)") is None


# -- building blocks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("literal", ["</p>", "</parameter>", "</｜DSML｜parameter>", "ab", "<<a", "x"])
def test_not_containing_matches_exactly_the_strings_without_the_literal(literal):
    pattern = re.compile(not_containing(literal).replace("\\/", "/"), re.S)
    rng = random.Random(literal)
    alphabet = sorted(set(literal + "<xa"))
    strict = literal[0] in literal[1:] or len(literal) == 1  # then the first character is excluded
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        expected = literal[0] not in text if strict else literal not in text
        assert (pattern.fullmatch(text) is not None) == expected, text


def test_speller_keeps_special_tokens_and_declared_delimiters_as_tokens(served):
    qwen = served["qwen"].tokenizer
    special = {qwen.token_to_id(t) for t in ("<tool_call>", "</think>")}
    delimiters = TokenDelimiters({"<think>": qwen.token_to_id("<think>")})
    speller = Speller.from_tokenizer(qwen, special.__contains__, delimiters)
    assert speller("<function=") == (Piece("<function="),)
    assert speller("x<tool_call>y") == (Piece("x"), Piece("<tool_call>", qwen.token_to_id("<tool_call>")), Piece("y"))
    assert speller("<think>") == (Piece("<think>", qwen.token_to_id("<think>"), text_matches=True),)
    assert speller("") == ()


def test_safe_schema_limits_free_strings_keys_and_numbers():
    pattern = string_pattern(ValueStyle(ValueFormat.RAW), "</v>")
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "e": {"enum": ["a<"]},
                                                "x": {"type": "number", "maximum": 3}, "y": {"type": ["number", "null"]}}}
    safe = safe_schema(schema, pattern)
    properties = safe["properties"]
    assert properties["s"]["pattern"] == pattern and "pattern" not in properties["e"]
    assert properties["x"] == {"type": "number", "maximum": 3}
    assert (properties["y"]["minimum"], properties["y"]["maximum"]) == (-1e15, 1e15)
    assert safe["additionalProperties"] is False and list(safe["patternProperties"]) == [pattern]
    assert safe_schema({}, pattern) == {"$ref": "#/$defs/helios_safe_json"}
    assert safe_schema({"type": "array"}, pattern)["items"] == {"$ref": "#/$defs/helios_safe_json"}
    assert string_pattern(ValueStyle(ValueFormat.XML_ESCAPED), "</v>").count("quot") == 0


def test_without_strings_keeps_the_other_alternatives():
    assert without_strings({"type": ["string", "integer"]}) == {"type": ["integer"]}
    assert without_strings({"anyOf": [{"type": "string"}, {"type": "null"}]}) == {"anyOf": [{"type": "null"}]}
    assert without_strings({"enum": ["a", 1]}) == {"enum": [1]}
    assert without_strings({"type": "string"}) is None and without_strings({"const": "a"}) is None


def test_call_policy_needs_spellable_tools():
    with pytest.raises(ValueError):
        CallPolicy((), AnswerKind.NONE)
    with pytest.raises(ValueError):
        CallPolicy((ToolSchema('bad"name'),), AnswerKind.FREE)
    tool = ToolSchema("f", {"properties": {"ok": {}, "bad\nkey": {}}, "required": ["ok"]})
    assert tool.properties() == [("ok", {}, True)]


def test_text_then_ends_text_at_the_first_stop():
    rules = LarkRules()
    close, terminal = (Piece("</c>"),), (Piece("<t>"),)
    upto = text_then(rules, [close, terminal])
    text = rules.text(f"{upto[0]} \"!\" | {upto[1]} \"?\"")
    assert text.count("[lazy]") == 2 and "<\\/c>" in text


@pytest.fixture(scope="module")
def frames_parts(served):
    case = served["atem"]
    compiler = GrammarCompiler.from_tokenizer(case.tokenizer, vocab_size=case.tokenizer.get_vocab_size(),
                                              eos_token_ids=[case.eos])
    speller = Speller.from_tokenizer(case.tokenizer, compiler.is_special_token, case.model.syntax.delimiters)
    return case, compiler, speller


def test_frames_continue_an_open_body_or_refuse_an_unusable_header(frames_parts):
    case, compiler, speller = frames_parts
    frames = case.model.syntax.output.frames
    answer = parse_response_format(TEXT_FORMAT)
    policy = CallPolicy(ToolSchema.from_openai(TOOLS), AnswerKind.STRUCTURED)
    lark = frames_lark(frames, speller, FrameStart(FramePosition.BODY, recipient="self"), policy, policy.answer, {})
    matcher = compiler.compile_lark(lark, answer)
    steps = ids_of(case.tokenizer, "still thinking<|eom|><|start|>assistant to=user<|message|>", '{"t":"x"}')
    assert all(matcher.consume_token(t) for t in steps + [case.eos]), matcher.error
    with pytest.raises(GrammarError, match="cannot continue") as caught:
        frames_lark(frames, speller, FrameStart(FramePosition.HEADER, header_text="assistant to=nobody"),
                    None, AnswerKind.STRUCTURED, {})
    assert caught.value.param == "messages"  # the rendered messages left the frame open


RECURSIVE_TREE = {"type": "object", "properties": {"label": {"type": "string"},
                                                   "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                                                   "next": {"$ref": "#/$defs/node"}},
                  "required": ["label"],
                  "$defs": {"node": {"type": "object", "properties": {"label": {"type": "string"},
                                                                       "next": {"$ref": "#/$defs/node"}}}}}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_recursive_tool_parameters_constrain_calls_under_every_syntax(served, syntax):
    """A tool whose parameters refer to themselves (a tree, a linked list) was a 400 under every
    forcing choice ("circular references with sibling keys"): the safe key pattern, added for keys
    the schema does not declare, applied to the declared keys too, so llguidance had to intersect
    the recursive `$ref` with it. Declared keys now take their own schemas only."""
    case = served[syntax]
    for fields in FORCING.values():
        prepared = case.model.prepare_chat(chat(case, tools=[tool(RECURSIVE_TREE)], **fields))
        assert prepared.grammar is not None
    linked = {**RECURSIVE_TREE, "properties": {k: v for k, v in RECURSIVE_TREE["properties"].items() if k != "children"}}
    prepared = case.model.prepare_chat(chat(case, tools=[tool(linked)], tool_choice="required"))
    rng = np.random.default_rng(7)
    for _ in range(10):
        _, final = run_output(prepared, sample(prepared.grammar.fork(), case, rng))
        assert final.result.errors == () and final.result.tool_calls, final.result
        for call in final.result.tool_calls:
            arguments = json.loads(call.arguments)
            assert call.complete and call.name == "f" and "label" in arguments, call
            assert is_tree(arguments), arguments


def is_tree(value, root: bool = True) -> bool:
    """Whether `value` is valid under RECURSIVE_TREE (root) or its `node` definition."""
    keys = {"label", "children", "next"} if root else {"label", "next"}
    if not isinstance(value, dict) or not set(value) <= keys:
        return False
    if "label" in value and not isinstance(value["label"], str):
        return False
    if "next" in value and not is_tree(value["next"], root=False):
        return False
    children = value.get("children", [])
    return isinstance(children, list) and all(is_tree(child, root=False) for child in children)


def test_qwen_free_text_beside_grammar_calls_never_spells_a_bare_function(served):
    """The Qwen Coder parser reads ``<function=NAME>...</function>`` written without ``<tool_call>``
    at the start of a line as a call (as vLLM's does): free answer text under ``parallel_tool_calls:
    false`` could write one before the one call the grammar allows, a second call no schema or count
    checked. Mid-line the parser reads it as answer text, and so the grammar lets prose name it there
    (it refused ``<function=`` anywhere, though a model explaining the syntax writes it mid-line)."""
    case = served["qwen"]
    tokenizer = case.tokenizer
    single = case.model.prepare_chat(chat(case, tools=TOOLS, parallel_tool_calls=False))
    head = ids_of(tokenizer, "</think>")
    assert accepts(single.grammar, head + plain_ids(tokenizer, "Use function=get_time <b>."))
    for line_start in ("Sure\n<function=get_time>", "<function=get_time>", "\n\n<function=x", "a\r\n<function="):
        assert not accepts(single.grammar, head + plain_ids(tokenizer, line_start)), line_start
    bare = plain_ids(tokenizer, "<function=get_time>\n</function>")
    result = run_output(single, head + plain_ids(tokenizer, "Sure\n") + bare + [case.eos])[1].result
    assert [call.name for call in result.tool_calls] == ["get_time"]  # what such text would have been
    prose = "Sure, I write <function=get_time>\n</function> to call it;\nor say <function=x> mid-line."
    call = ids_of(tokenizer, "\n\n", "<tool_call>", "\n<function=get_time>\n</function>\n", "</tool_call>")
    for then, names in (([], []), (call, ["get_time"])):
        result = drive(single, head + plain_ids(tokenizer, prose) + then + [case.eos])
        assert (result.content, [c.name for c in result.tool_calls], result.errors) == (prose, names, ()), result
