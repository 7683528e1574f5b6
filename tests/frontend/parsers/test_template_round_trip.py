"""Tool calls rendered by each family's published chat template parse back to what was rendered.

A differential test with the template as the reference. For each family of
tests/support/family_checkpoints.py the module derives the family's frontend from its template and
tokenizer as preparation does (`read_assets`: the probes, the family's syntax data) and builds the
served `FrontendModel` from it. Each seeded conversation ends in an assistant turn with 1 to 3 tool
calls (random names and JSON arguments: nested values, unicode, the syntaxes' own markup characters,
number spellings, empty strings and objects), plus reasoning and content where the template renders
them. transformers' `apply_chat_template` renders the conversation; the assistant turn's generated
part (after the generation prompt, up to and including its end-of-turn token) is tokenized with the
family's real tokenizer and run through the served output path, which must answer the same calls
(name; arguments JSON-equal, or for text-valued syntaxes equal under the tool schema's typing), the
same content and reasoning, and finish reason ``tool_calls``; its SSE chunks add up to the same
message. The same tokens fed to the output pipeline in random chunks give the identical result.

What a template cannot represent is left out of the draws, each where it is drawn:
- a value or text holding the spelling of a control token, or of a delimiter the parsers read by its
  token (think tags, harmony controls), is re-tokenized here as that token, which the parsers read as
  markup wherever it stands; a model writing the text as text would not produce it (`Draw._usable`);
- text-valued syntaxes (Qwen3-Coder, GLM-4.5) write a string as its bare text: a parameter's schema
  declares one type, since a string parameter that also allows a number cannot tell ``"3"`` from
  ``3``; and their values never hold the value's closing tag followed by a tag that may follow a
  value (`_AMBIGUOUS_VALUES`): the template writes values unescaped;
- templates strip the outer whitespace of reasoning and content, so the drawn texts have none;
- Llama 3.1 and gpt-oss templates take one call per assistant message, Llama 3.1 and Mistral v0.3
  drop content beside calls, DeepSeek V3.1 drops reasoning from an assistant message.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import json_format

from helios.contract import serving_pb2 as spb
from helios.frontend.decoding.events import ParseErrorKind
from helios.frontend.decoding.syntax import (
    OutputSyntax, ReasoningSyntaxKind, ThinkSyntax, ToolSyntaxKind, example_glm_arguments, example_qwen_coder,
)
from helios.frontend.parsers import (
    OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters, ToolRegistry,
)
from helios.frontend.parsers.start import pending_answer_lead
from helios.frontend.session import FrontendModel
from helios.frontend.structured.grammar import GrammarCompiler
from helios.ignition.checkpoint_assets import read_assets
from helios.server.schemas import ChatCompletionRequest
from support.family_checkpoints import CASES, FamilyCase, hf_tokenizer, train_tokenizer

from ..served import run_output, served_contract
from .golden import FILLER_ID, coarsest, detokenize, random_chunks, run

CONVERSATIONS_PER_FAMILY = 40
CHUNKINGS = 3  # random chunkings per conversation, besides one token a feed and the coarsest


@dataclass(frozen=True)
class Rendering:
    """What a family's template renders beside calls, and the end of its turn."""

    max_calls: int = 3
    content: bool = True  # content beside calls is rendered
    reasoning: bool = False  # reasoning of the final assistant turn is rendered
    typed_text: bool = False  # values are written as text, typed by the tool's schema
    turn_end: str = ""  # appended where the template renders no end of the final turn
    system: bool = True  # a system message renders the same with and without the final turn
    thinking_switch: str = ""  # the template argument that closes reasoning in the prompt when false
    text_arguments: bool = False  # arguments given as JSON text are written as that text


RENDERINGS = {
    "hermes": Rendering(reasoning=True, thinking_switch="enable_thinking", text_arguments=True),
    "qwen3-coder": Rendering(typed_text=True),
    "deepseek-v3": Rendering(),
    "deepseek-v3.1": Rendering(),
    # The model stops with <|observation|> (a generation_config EOS) before the tool results.
    "glm-4.5": Rendering(reasoning=True, typed_text=True, turn_end="<|observation|>", thinking_switch="enable_thinking"),
    "llama3": Rendering(max_calls=1, content=False),
    # The system message renders only in front of the conversation's last message.
    "mistral": Rendering(content=False, system=False),
    "harmony": Rendering(max_calls=1, reasoning=True, text_arguments=True),
}
# Text-valued syntaxes write values unescaped: a value holding its closing tag followed by (space
# and) a tag that may follow a value reads as the value's end and the next tag, so none is drawn.
# The closing tag before any other text is value text, and is drawn. In Qwen3-Coder a tag that may
# follow a value at a line's start (the value's or after a newline) ends a value whose closer was
# left out (`tag_tools`), so none is drawn either; elsewhere in a line it is value text, and is drawn.
_AMBIGUOUS_VALUES = {
    "qwen3-coder": re.compile(r"</parameter>\s*(<parameter=|</function>|</tool_call>)"
                              r"|(^|\n)(<parameter=[^<>\"\n]+>|</function>|</tool_call>)"),
    "glm-4.5": re.compile(r"</arg_value>\s*(<arg_key>|</tool_call>)"),
}

# --- the family's served frontend ------------------------------------------------------------------


_SAVED: dict[int, tuple[object, Path]] = {}  # a tokenizer's tokenizer.json, saved once (its id: the entry holds it)


def _checkpoint(case: FamilyCase, tokenizer, directory: Path) -> Path:
    """The files preparation reads the frontend from (no weights). Families with one tokenizer copy
    its first save (half a second for a 150k vocabulary)."""
    directory.mkdir(parents=True, exist_ok=True)
    if id(tokenizer) in _SAVED:
        shutil.copyfile(_SAVED[id(tokenizer)][1], directory / "tokenizer.json")
    else:
        tokenizer.save(str(directory / "tokenizer.json"))
        _SAVED[id(tokenizer)] = (tokenizer, directory / "tokenizer.json")
    (directory / "config.json").write_text(json.dumps({"model_type": case.model_type}))
    template = (Path(__file__).parents[2] / "fixtures" / "templates" / case.template).read_text()
    settings = {"chat_template": template, "eos_token": case.eos, "bos_token": case.bos}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    eos_ids = [tokenizer.token_to_id(t) for t in (case.eos, *case.eos_extra)]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    return directory


def family_frontend(case: FamilyCase, tokenizer, directory: Path) -> FrontendModel:
    assets = read_assets(_checkpoint(case, tokenizer, directory), tokenizer.get_vocab_size())
    declared = assets.frontend
    section = spb.FrontendContract(tool_parser=declared.tool_parser, reasoning_parser=declared.reasoning_parser)
    for name in ("tool_syntax", "reasoning_syntax", "assistant_boundary", "channel_syntax"):
        if getattr(declared, name) is not None:
            getattr(section, name).CopyFrom(getattr(declared, name))
    section.prefix_boundaries.extend(declared.prefix_boundaries)
    frontend = json_format.MessageToDict(section, preserving_proto_field_name=True)
    tokens = [json_format.MessageToDict(t, preserving_proto_field_name=True) for t in assets.template_tokens]
    contract = served_contract(tokenizer.get_vocab_size(), frontend, list(assets.eos_token_ids), tokens)
    return FrontendModel.from_contract(contract, tokenizer, assets.chat_template)


@pytest.fixture(scope="module")
def shared_grammars():
    """Families with one tokenizer and EOS ids share a grammar compiler (read-only here; building
    one for a 150k vocabulary takes seconds)."""
    built = {}
    build = GrammarCompiler.from_tokenizer

    def shared(tokenizer, **options):
        key = (id(tokenizer), json.dumps(options, sort_keys=True, default=list))
        if key not in built:
            built[key] = build(tokenizer, **options)
        return built[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GrammarCompiler, "from_tokenizer", shared)
        yield


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family(request, tmp_path_factory, qwen_tokenizer, deepseek_tokenizer, shared_grammars):
    case: FamilyCase = request.param
    tokenizer = {"qwen": qwen_tokenizer, "deepseek": deepseek_tokenizer}.get(case.tokenizer)
    tokenizer = tokenizer or train_tokenizer(case.special_tokens)
    frontend = family_frontend(case, tokenizer, tmp_path_factory.mktemp(f"round-trip-{case.name}"))
    # Spellings the tokenizer encodes as a control token, or as a delimiter the parsers read by its
    # token: a drawn text never holds one (see the module docstring).
    syntax = frontend.syntax.output
    delimiters = [s for s in syntax.delimiter_spellings() if frontend.syntax.delimiters.is_single_token(s)]
    controls = (*(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special), *delimiters)
    return case, tokenizer, frontend, hf_tokenizer(case, tokenizer), controls


# --- drawing conversations -------------------------------------------------------------------------

PIECES = (
    "Paris", "東京", "🧪", "🌧️", "naïve café", "<", ">", "</", '"', "'", "\\", "\\n", "\n", "\t", " ", "{", "}", "[1]",
    "｜", "<｜", "｜>", "=", "&amp;", "&lt;", "</parameter>", "<parameter=x>", "</function>", "</tool_call>",
    "<tool_call>", "<arg_key>", "</arg_value>", "<arg_value>", "```", "```json\n", '{"a": 1}', "null", "true", "3",
    "-1.5e3", "to=functions.x", "<|", "|>", "[TOOL_CALLS]", "<think>", "</think>", "\u2028", "e\u0301",
)
# Parameter schemas and the value kinds drawn for them. Each allows one reading of a value's text:
# no string parameter also allows another type (see the module docstring).
NODE = {"type": "object", "properties": {"name": {"type": "string"}, "next": {"$ref": "#/$defs/node"}}}
PARAMETERS = (
    (("string",), {"type": "string"}),
    (("string",), {"type": "string", "description": "Any text.", "maxLength": 200}),
    (("integer",), {"type": "integer", "minimum": -(10**20)}),
    (("number",), {"type": "number"}),
    (("integer",), {"type": "number"}),
    (("boolean",), {"type": "boolean"}),
    (("object",), {"type": "object", "properties": {"a": {"type": "string"}}}),
    (("object",), {"$ref": "#/$defs/node"}),
    (("array",), {"type": "array", "items": {}}),
    (("integer", "null"), {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    (("number", "null"), {"type": ["number", "null"]}),
)
TEXTS = ("Checking the weather.", "Sure — 東京 🧪 first.", "a < b && c > d", "Line one\nline two", "Use \"quotes\" \\ ok")


class Draw:
    """One seeded draw: tools with schemas, a conversation, and its final assistant turn."""

    def __init__(self, case: FamilyCase, seed: int, controls: tuple[str, ...], opener: str = ""):
        self.random = random.Random(seed)
        self.case = case
        self.rendering = RENDERINGS[case.name]
        self.controls = controls
        self.opener = opener  # the tool block opener: text holding it starts a block
        self.kinds: dict[tuple[str, str], tuple[str, ...]] = {}  # (tool, parameter) -> the kinds drawn

    def _usable(self, text: str) -> bool:
        if any(control in text for control in self.controls):  # would be re-tokenized as the control
            return False
        ambiguous = _AMBIGUOUS_VALUES.get(self.case.name)
        return ambiguous is None or ambiguous.search(text) is None

    def text(self, limit: int = 4) -> str:
        r = self.random
        while True:
            text = "".join(r.choice(PIECES) if r.random() < 0.7 else r.choice(string.printable)
                           for _ in range(r.randint(0, limit)))
            if self._usable(text):
                return text

    def prose(self) -> str:
        """Content or reasoning: no outer whitespace (templates strip it), no tool-block opener."""
        r = self.random
        if r.random() < 0.5:
            return r.choice(TEXTS)
        while True:
            text = self.text(6).strip()
            if text and self._usable(text) and not (self.opener and self.opener in text):
                return text

    def name(self) -> str:
        r = self.random
        first = r.choice(string.ascii_letters + "_")
        rest = "".join(r.choice(string.ascii_letters + string.digits + "_") for _ in range(r.randint(0, 8)))
        parts = [first + rest]
        while r.random() < 0.4:
            parts.append(r.choice(".-_") + "".join(r.choice(string.ascii_lowercase + string.digits)
                                                    for _ in range(r.randint(1, 5))))
        return "".join(parts)

    def json_value(self, depth: int = 0):
        r = self.random
        kind = r.choice(("string", "string", "integer", "number", "boolean", "null", "object", "array"))
        if depth >= 3 and kind in ("object", "array"):
            kind = "string"
        return self.value_of(kind, depth)

    def value_of(self, kind: str, depth: int = 0):
        r = self.random
        if kind == "string":
            return self.text()
        if kind == "integer":
            return r.choice((0, 1, -1, 7, -42, 10**12, -(10**18), r.randint(-1000, 1000)))
        if kind == "number":
            return r.choice((0.5, -2.25, 1e-05, 6.02e23, -1.5e-7, 3.0, -0.0, r.uniform(-1e6, 1e6), 1e300))
        if kind == "boolean":
            return r.random() < 0.5
        if kind == "null":
            return None
        if kind == "object":
            return {self.key(): self.json_value(depth + 1) for _ in range(r.randint(0, 3))}
        return [self.json_value(depth + 1) for _ in range(r.randint(0, 3))]

    def key(self) -> str:
        return self.text(2) if self.random.random() < 0.3 else self.name()

    def tools(self) -> list[dict]:
        tools, names = [], set()
        for _ in range(self.random.randint(1, 3)):
            name = self.name()
            if name in names:
                continue
            names.add(name)
            properties = {}
            for _ in range(self.random.randint(0, 5)):
                kinds, schema = self.random.choice(PARAMETERS)
                key = self.random.choice(("p_", "城市_", "ключ.")) + self.name()
                properties[key] = schema
                self.kinds[name, key] = kinds
            parameters = {"type": "object", "properties": properties, "$defs": {"node": NODE}}
            tools.append({"type": "function", "function": {"name": name, "description": "A tool.",
                                                           "parameters": parameters}})
        return tools

    def arguments(self, tool: dict) -> dict:
        r = self.random
        name = tool["function"]["name"]
        arguments = {}
        for key in tool["function"]["parameters"]["properties"]:
            if r.random() < 0.2:
                continue
            arguments[key] = self.value_of(r.choice(self.kinds[name, key]))
        if not self.rendering.typed_text and r.random() < 0.3:  # free JSON where the syntax carries JSON
            arguments.update({self.key(): self.json_value() for _ in range(r.randint(1, 3))})
        return arguments

    def call_id(self, index: int) -> str:  # nine alphanumerics: the Mistral template requires them
        return "".join(self.random.choice(string.ascii_letters + string.digits) for _ in range(8)) + str(index)

    def conversation(self) -> tuple[list[dict], dict, list[dict], dict]:
        """(the messages before the final turn, the final assistant message, the tools, the
        chat_template_kwargs)."""
        r = self.random
        tools = self.tools()
        messages = []
        if self.rendering.system and r.random() < 0.5:
            messages.append({"role": "system", "content": r.choice(TEXTS)})
        messages.append({"role": "user", "content": r.choice(TEXTS)})
        if r.random() < 0.3:
            messages += [{"role": "assistant", "content": r.choice(TEXTS)}, {"role": "user", "content": "And now?"}]
        calls = []
        for index in range(r.randint(1, self.rendering.max_calls)):
            tool = r.choice(tools)
            arguments = self.arguments(tool)
            text = self.case.string_arguments or (self.rendering.text_arguments and r.random() < 0.5)
            if text:  # JSON text as clients send it back, in the spellings a model may write
                arguments = json.dumps(arguments, ensure_ascii=r.random() < 0.5, indent=r.choice((None, None, 2)),
                                       separators=r.choice((None, (",", ":"), (", ", ": "))))
            calls.append({"id": self.call_id(index), "type": "function",
                          "function": {"name": tool["function"]["name"], "arguments": arguments}})
        final = {"role": "assistant", "content": "", "tool_calls": calls}
        if self.rendering.content and r.random() < 0.6:
            final["content"] = self.prose()
        switch, kwargs = self.rendering.thinking_switch, {}
        if switch and r.random() < 0.4:
            kwargs[switch] = r.random() < 0.3
        if self.rendering.reasoning and kwargs.get(switch, True) and r.random() < 0.7:
            final["reasoning_content"] = self.prose()
        return messages, final, tools, kwargs


# --- rendering and parsing -------------------------------------------------------------------------


def generated_part(case: FamilyCase, hf, messages: list[dict], final: dict, tools: list[dict], kwargs: dict) -> str:
    """The final assistant turn as the model generates it: the rendering of the whole conversation
    after the generation prompt, up to and including its first end-of-turn token."""
    prompt = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
    whole = hf.apply_chat_template([*messages, final], tools=tools, tokenize=False, **kwargs)
    assert whole.startswith(prompt), (prompt, whole)
    turn = whole[len(prompt):] + RENDERINGS[case.name].turn_end
    ends = [turn.find(t) + len(t) for t in (case.eos, *case.eos_extra) if t in turn]
    assert ends, turn
    return turn[:min(ends)]


def typed(value):
    """A JSON value compared with its types: ``True`` is not ``1`` (``3`` and ``3.0`` are one number)."""
    if isinstance(value, dict):
        return "object", {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return "array", [typed(item) for item in value]
    return type(value).__name__ if isinstance(value, (bool, str)) or value is None else "number", value


def expected_message(final: dict) -> tuple[str, str, list]:
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in final["tool_calls"]]
    calls = [(name, typed(json.loads(a) if isinstance(a, str) else a)) for name, a in calls]
    return final.get("reasoning_content") or "", final.get("content") or "", calls


def streamed_choice(chunks: list[dict]) -> dict:
    """The chat choice that a stream's chunks add up to (content null beside calls, as the body)."""
    message: dict = {"role": "assistant", "content": ""}
    calls: dict[int, dict] = {}
    reason = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice.get("delta", {})
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    message[key] = message.get(key, "") + delta[key]
            for call in delta.get("tool_calls") or ():
                into = calls.setdefault(call["index"], {"id": call.get("id"), "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
                for key in ("name", "arguments"):
                    into["function"][key] += call.get("function", {}).get(key) or ""
            reason = choice.get("finish_reason") or reason
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
        message["content"] = message["content"] or None
    return {"message": message, "finish_reason": reason}


def check_conversation(family, seed: int) -> None:
    case, tokenizer, frontend, hf, controls = family
    tools_syntax = frontend.syntax.output.tools
    opener = tools_syntax.block_open if tools_syntax is not None else ""
    messages, final, tools, kwargs = Draw(case, seed, controls, opener).conversation()
    turn = generated_part(case, hf, messages, final, tools, kwargs)
    ids = tokenizer.encode(turn, add_special_tokens=False).ids
    body = {"model": frontend.served_id, "messages": messages, "tools": tools, "chat_template_kwargs": kwargs}
    prepared = frontend.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="rt")
    where = f"seed {seed}: {turn!r}"

    steps, output = run_output(prepared, ids)
    choice = prepared.response_body(output)["choices"][0]
    message = choice["message"]
    got = [(c["function"]["name"], typed(json.loads(c["function"]["arguments"])))
           for c in message.get("tool_calls") or []]
    reasoning, content, calls = expected_message(final)
    assert got == calls, where
    assert (message.get("content") or "") == content, where
    assert (message.get("reasoning_content") or "") == reasoning, where
    assert choice["finish_reason"] == "tool_calls", where
    assert not output.result.errors, where
    presenter = prepared.new_stream()  # the SSE deltas add up to the JSON body
    chunks = [*presenter.start_chunks(), *(c for step in steps for c in presenter.step_chunks(step)),
              *presenter.finish_chunks(output)]
    assert streamed_choice(chunks) == {key: choice[key] for key in ("message", "finish_reason")}, where

    # The same tokens (the withheld end-of-turn token left out) in random chunks: the same result.
    factory = prepared.output
    fed = ids[:-1] if ids[-1] in factory.eos_token_ids else ids
    stream = detokenize(tokenizer, fed)
    delimiters = factory.frontend.delimiters
    make = lambda: OutputPipeline.create(factory.frontend.output, delimiters, factory.request)
    reference = run(make(), stream).result
    assert reference == output.result, where
    rng = random.Random(seed)
    for feeds in [coarsest(stream, delimiters)] + [random_chunks(stream, delimiters, rng) for _ in range(CHUNKINGS)]:
        assert run(make(), feeds).result == reference, (where, feeds)


def test_rendered_tool_calls_parse_back(family):
    for seed in range(CONVERSATIONS_PER_FAMILY):
        check_conversation(family, seed)


# --- the parser behaviour the round trips rely on, on one syntax at a time -------------------------

QWEN_CODER = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.QWEN_CODER_FUNCTIONS, tools=example_qwen_coder())
GLM = OutputSyntax(ReasoningSyntaxKind.NONE, ToolSyntaxKind.GLM_ARGUMENTS, tools=example_glm_arguments())
STRINGS = ToolRegistry.from_openai([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "n": {"type": "integer"}}}}}])


def qwen_coder_call(*params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def glm_call(*params: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in params)
    return f"<tool_call>f\n{body}</tool_call>"


def parse_in_chunks(syntax: OutputSyntax, text: str, seed: int):
    """The result of `text` fed whole, checked equal for one character a feed and random chunks."""
    delimiters = TokenDelimiters({})
    make = lambda: OutputPipeline.create(syntax, delimiters, OutputRequest(STRINGS, "c"))
    whole = run(make(), [(FILLER_ID, text)]).result
    rng = random.Random(seed)
    chunkings = [random_chunks([(FILLER_ID, text)], delimiters, rng) for _ in range(5)]
    for feeds in [[(FILLER_ID, c) for c in text], *chunkings]:
        assert run(make(), feeds).result == whole, feeds
    return whole


@pytest.mark.parametrize("syntax, call", [(QWEN_CODER, qwen_coder_call), (GLM, glm_call)], ids=["qwen-coder", "glm"])
@pytest.mark.parametrize("value", ["x</parameter>y", "</parameter>", "a</arg_value>b", "</arg_value>\n\nz",
                                   "<arg_value>c</arg_value>", "</parameter>\n</parameter>"])
def test_a_value_closer_before_other_text_is_value_text(syntax, call, value):
    """Templates write values unescaped: a closer followed by anything but a tag that may follow a
    value is part of the value (it used to end the value and drop the rest as unexpected text)."""
    result = parse_in_chunks(syntax, call(("a", value), ("n", "3")), seed=len(value))
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("f", {"a": value, "n": 3})]
    assert result.errors == () and result.content == ""


@pytest.mark.parametrize("syntax, call", [(QWEN_CODER, qwen_coder_call), (GLM, glm_call)], ids=["qwen-coder", "glm"])
def test_a_repeated_parameter_keeps_its_first_value(syntax, call):
    """Arguments JSON never holds a key twice: a repeated parameter's value is dropped with an error
    (the first value has been streamed already)."""
    result = parse_in_chunks(syntax, call(("a", "one"), ("b", "two"), ("a", "three"), ("n", "4"), ("n", "5")), seed=3)
    assert [c.arguments for c in result.tool_calls] == ['{"a": "one", "b": "two", "n": 4}']
    repeated = ParseErrorKind.MALFORMED_CALL
    assert [(e.kind, e.detail) for e in result.errors] == [
        (repeated, "f.a: repeated parameter"), (repeated, "f.n: repeated parameter")]
    assert "three" in result.markup and "5" in result.markup


@pytest.mark.parametrize("envelope, after_close, lead", [
    ("<think></think>", "\n", "\n"),  # GLM-4.5 with enable_thinking false: the model writes the newline
    ("<think>\n\n</think>\n\n", "\n\n", ""),  # Qwen3: the prompt wrote it
    ("</think>\n", "\n\n", "\n"),
    ("</think>x", "\n", ""),
    ("no close", "\n", ""),
])
def test_a_prompt_that_closed_reasoning_leaves_the_rest_of_its_wrapping_to_the_answer(envelope, after_close, lead):
    think = ThinkSyntax("<think>", "</think>", after_close=after_close)
    assert pending_answer_lead(envelope, think) == lead
    syntax = OutputSyntax(ReasoningSyntaxKind.THINK_TAGS, ToolSyntaxKind.NONE, think=think)
    for output in ("Hello\n", f"{lead}Hello\n"):
        start = OutputStart(ReasoningState.CLOSED, answer_lead=lead)
        pipeline = OutputPipeline.create(syntax, TokenDelimiters({}), OutputRequest(STRINGS, "c", start))
        result = run(pipeline, [(FILLER_ID, output)]).result
        assert (result.content, result.reasoning) == ("Hello\n", "")
