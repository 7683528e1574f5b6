"""Seeded random conversations, rendered by the frontend and by transformers, token for token.

For each frontend family (tests/support/family_checkpoints.py) the module takes the family's tiny
core (prepared once per process with test_families, `prepared_family_core`) and builds its
`FrontendModel` from the core's contract, tokenizer and chat template, as the server does, without
loading weights: `prepare_chat` turns a `ChatCompletionRequest` into prompt ids exactly as a served
request is prepared. Each drawn conversation is what a real client sends (system
or developer messages, text parts, names, empty and whitespace-only text, unicode, several parallel
tool calls with nested or empty arguments, tool results, reasoning_content in history, consecutive
user turns, 0 to 3 tools with varied schemas, tool_choice, chat_template_kwargs, reasoning_effort), and
the reference is transformers' rendering of the same conversation:

- text parts reach the template as parts, as transformers passes them, where the family's template
  renders them itself (`TEXT_PART_ROLES`: GLM-4.5's, for all but tool messages, whose parts it prints
  as Python reprs); elsewhere, where transformers' render raises on a list or prints its repr, they
  are joined with newlines (vLLM's "string" content format); an assistant message without content has ``content: null`` (OpenAI's shape), which the
  template receives as none, ``tool_calls`` null or ``[]`` are no calls (the key is left out), and
  tool-call arguments reach the template as the family's reference wants them (test_families: JSON
  text for DeepSeek's string concatenation, an object elsewhere);
- declared tools are rendered whatever tool_choice says (``"none"`` included, as vLLM renders them by
  default) unless the list is empty (the documented policy);
  developer messages render as system messages where the core declares no developer role;
- ``reasoning_effort`` is the template's ``reasoning_effort`` argument (gpt-oss reads it, and grades
  only low, medium and high: another effort is refused), and ``enable_thinking`` (or DeepSeek-V3.1's
  ``thinking``) where the template reads that switch;
- client text holding the template's control markers renders to the same text, and its markers are
  encoded as text (transformers' ``sanitize_control_tokens``): no client marker becomes a control
  token. Where only the merges at a marker's edges differ, the control tokens and the decoded text
  are compared.

Where the reference template raises for a conversation, Helios must refuse it with a `RequestError`
(an HTTP 400 naming what failed), never another exception (a 500) and never a prompt.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from transformers.utils import chat_template_utils

from helios.errors import RequestError
from helios.frontend.preparation.client_fields import GRADED_EFFORTS, ReasoningEffortConflict, UngradedReasoningEffort
from helios.frontend.preparation.control_markers import is_marker
from helios.frontend.preparation.messages import MessageError, Role
from helios.frontend.preparation.prompt import PromptBuilder, PromptRules, ReasoningState
from helios.frontend.preparation.template import ChatTemplate
from helios.frontend.session import FrontendModel
from helios.runtime.loading.model import resource_of_kind
from helios.server.schemas import ChatCompletionRequest
from support.family_checkpoints import CASES, FamilyCase, hf_tokenizer, prepared_family_core
from support.sweeps import swept

from .conftest import served_tokenizer

# Each, with and without control markers in client text. HELIOS_RENDER_FUZZ_SWEEP=1 draws 100: the
# default 40 already take each family's render path (the same drawing code, the same seeds first).
CONVERSATIONS_PER_FAMILY = 100 if swept("HELIOS_RENDER_FUZZ_SWEEP") else 40

TEXTS = (
    "What is the weather in Paris?", "Hello", "", " ", "\n", "  \t\n ", "Grüße aus Köln — 東京 🌧️ ok?",
    "line one\nline two\n", "\n\nleading newlines", "trailing spaces   ", '{"json": [1, 2, {"a": null}]}',
    "a {{ jinja }} {% raw %} b", "zero\u200bwidth", "tab\tseparated", "Über 5 °C, naïve café", "é" * 3,
    "/nothink", "```json\n{}\n```", "None", "\\n escaped \\u0041", "crlf\r\nline", "nul\x00byte", "sep\u2028para",
    "\ufeffbom", "e\u0301 combining", "<", "<|", "[", "tail <|im",
)
# Control markers of one family or another: client text, which no family may turn into control tokens.
MARKERS = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
    "[INST]", "[/INST]", "[TOOL_CALLS]", "<|eot_id|>", "<|start_header_id|>", "<｜User｜>", "<｜Assistant｜>",
    "<｜tool▁call▁begin｜>", "<|end|>", "<|start|>", "<|message|>", "<|channel|>", "<|user|>", "<|observation|>",
    "<arg_key>", "<s>", "</s>", "<|endoftext|>", "<|begin_of_text|>",
)
NAMES = ("alice", "Bob_2", "näme")
SCHEMAS = (
    None,
    {"type": "object", "properties": {}},
    {"type": "object", "properties": {"city": {"type": "string", "description": "A city"}}, "required": ["city"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}, "unit": {"type": "string",
     "enum": ["c", "f"]}, "flag": {"type": "boolean"}}, "required": ["n"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "number"}},
     "opts": {"type": "object", "properties": {"deep": {"type": "string"}}}}},
    {"type": "object", "properties": {"q": {"type": ["string", "null"], "description": "Grüße \"quoted\""}},
     "additionalProperties": False},
    {"type": "object", "properties": {"node": {"$ref": "#/$defs/node"}}, "$defs": {"node": {"type": "object",
     "properties": {"ünï": {"type": "string", "default": "x"}, "next": {"$ref": "#/$defs/node"}}}}},
    {"type": "object", "properties": {"when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "integer"}]},
     "mode": {"const": "fast"}, "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}}},
)
ARGUMENTS = (
    {}, {"city": "Paris"}, {"city": "東京 🌧️"}, {"n": 3, "unit": "c", "flag": True},
    {"items": [1, 2.5, -3e-05], "opts": {"deep": "x", "more": {"list": [None, False]}}},
    {"q": None}, {"q": "line\nbreak \"quoted\" \\ back"}, {"text": ""}, {"nested": {"a": {"b": {"c": [[]]}}}},
)

# Argument texts as clients write them: number spellings, escapes, duplicate keys, outer whitespace.
ARGUMENT_TEXTS = (
    '{"x": 1.0, "y": 1E5, "z": -0.0, "w": 1.5e-7, "big": 123456789012345678901234567890}',
    '{"u": "\\u00e9\\ud83d\\ude00 \\/ \\t"}', '{"a": 1, "a": 2}', ' {"pad": true}\n', '{"s": "\\ud800"}',
    '{"k": {"z": 1, "a": [true, false, null]}, "\u00e9": "\u6771"}',
)

# --- drawing conversations ---------------------------------------------------------------------------


class Draw:
    """One seeded conversation draw; `markers` says whether client text may hold control markers."""

    def __init__(self, seed: int, markers: bool):
        self.random = random.Random(seed)
        self.markers = markers
        self.call_number = 0

    def text(self, *, marker_ok: bool = True) -> str:
        r = self.random
        if self.markers and marker_ok and r.random() < 0.35:
            return r.choice(("", "say ", "x")) + r.choice(MARKERS) + r.choice(("", " tail", "\nsystem\nforged", "x"))
        return r.choice(TEXTS)

    def content(self, *, marker_ok: bool = True) -> str | list[dict]:
        if self.random.random() < 0.3:
            return [{"type": "text", "text": self.text(marker_ok=marker_ok)} for _ in range(self.random.randint(1, 3))]
        return self.text(marker_ok=marker_ok)

    def call_id(self) -> str:
        self.call_number += 1
        return f"call{self.call_number:02d}ab"[:9].ljust(9, "z")  # nine alphanumerics: Mistral requires them

    def arguments(self) -> str:
        if self.random.random() < 0.2:
            return self.random.choice(ARGUMENT_TEXTS)
        value = self.random.choice(ARGUMENTS)
        if self.markers and self.random.random() < 0.3:
            value = {"text": self.text()}
        separators = self.random.choice(((", ", ": "), (",", ":")))
        return json.dumps(value, ensure_ascii=self.random.random() < 0.5, separators=separators)

    def tools(self) -> list[dict]:
        tools = []
        for i in range(self.random.choice((0, 0, 1, 1, 2, 3))):
            function = {"name": self.random.choice(("get_weather", "lookup", "do.it", "f-2")) + f"_{i}"}
            if self.random.random() < 0.7:
                function["description"] = self.text() or "Does a thing."
            schema = self.random.choice(SCHEMAS)
            if schema is not None:
                function["parameters"] = schema
            tools.append({"type": "function", "function": function})
        return tools

    def assistant(self, tool_names: list[str]) -> tuple[dict, list[str]]:
        """An assistant message of the history and its call ids. Its text holds no marker: templates
        split it at ``</think>``, which client text no longer holds (control_markers)."""
        r = self.random
        message: dict = {"role": "assistant"}
        calls = []
        if tool_names and r.random() < 0.5:
            for _ in range(r.choice((1, 1, 2, 3))):
                name = r.choice(tool_names)
                if self.markers and r.random() < 0.15:
                    name += r.choice(MARKERS)  # a history's call names what the model wrote
                calls.append({"id": self.call_id(), "type": "function",
                              "function": {"name": name, "arguments": self.arguments()}})
            message["tool_calls"] = calls
            choice = r.random()
            if choice < 0.4:
                message["content"] = None
            elif choice < 0.6:
                pass  # no content key: the same as null
            else:
                message["content"] = self.content(marker_ok=False)
        else:
            message["content"] = self.content(marker_ok=False)
            if r.random() < 0.1:
                message["tool_calls"] = []  # some clients send an empty list for "no calls"
        if r.random() < 0.4:
            message["reasoning_content"] = self.text(marker_ok=False)
        if r.random() < 0.1:
            message["name"] = r.choice(NAMES)
        return message, [call["id"] for call in calls]

    def user(self) -> dict:
        message = {"role": "user", "content": self.content()}
        if self.random.random() < 0.15:
            message["name"] = self.random.choice(NAMES) + (self.random.choice(MARKERS) if self.markers else "")
        return message

    def system(self, role: str = "system") -> dict:
        message = {"role": role, "content": self.content()}
        if self.random.random() < 0.1:
            message["name"] = self.random.choice(NAMES)
        return message


def draw_request(case: FamilyCase, seed: int, markers: bool = False) -> dict:
    """One chat request body: a conversation a client sends, ending in a user or tool message, or now
    and then in an assistant message."""
    draw = Draw(seed, markers)
    r = draw.random
    tools = draw.tools()
    names = [tool["function"]["name"] for tool in tools]
    messages = []
    opening = r.random()
    if opening < 0.45:
        messages.append(draw.system())
    elif opening < 0.6:
        messages.append(draw.system("developer"))
    elif opening < 0.7:
        messages += [draw.system(), draw.system(r.choice(("system", "developer")))]
    for turn in range(r.randint(1, 3)):
        messages.append(draw.user())
        if r.random() < 0.15:
            messages.append(draw.user())  # consecutive user messages
        if turn == 0 and r.random() < 0.05:
            messages.append(draw.system())  # a system message mid-conversation
        is_last = r.random() < 0.4
        if is_last and turn > 0:
            break
        for _ in range(r.choice((1, 1, 2))):
            assistant, call_ids = draw.assistant(names)
            messages.append(assistant)
            for call_id in call_ids:
                result = {"role": "tool", "tool_call_id": call_id, "content": draw.content()}
                if r.random() < 0.2:
                    result["name"] = next(c["function"]["name"] for c in assistant["tool_calls"] if c["id"] == call_id)
                messages.append(result)
            if not call_ids:
                break
        if messages[-1]["role"] == "tool" and r.random() < 0.5:
            break  # the model answers the tool results next
    if r.random() < 0.1:
        messages.append({"role": "assistant", "content": draw.content(marker_ok=False), "tool_calls": None})
    body: dict = {"model": case.name, "messages": messages, "max_tokens": 1}
    if tools or r.random() < 0.1:
        body["tools"] = tools
        if r.random() < 0.3:
            body["tool_choice"] = r.choice(("none", "auto"))
    kwargs = {}
    if r.random() < 0.4:
        kwargs["enable_thinking"] = r.random() < 0.5
    if r.random() < 0.3:
        kwargs["thinking"] = r.random() < 0.5
    if kwargs or r.random() < 0.1:
        body["chat_template_kwargs"] = kwargs
    if r.random() < 0.15 and not kwargs.keys() & {"enable_thinking", "thinking"}:
        body["reasoning_effort"] = r.choice(("none", "low", "high"))
    return body


# --- the reference -----------------------------------------------------------------------------------


# The roles whose text parts a family's template renders (as it renders their texts joined with
# nothing between); the other families' templates raise on a list or print its repr.
TEXT_PART_ROLES = {"glm-4.5": {"system", "user", "assistant"}}


def reference_messages(case: FamilyCase, messages: list[dict], developer_as_system: bool) -> list[dict]:
    """The conversation as transformers is given it (see the module docstring)."""
    converted = []
    for message in messages:
        item = dict(message)
        if item["role"] == "developer" and developer_as_system:
            item["role"] = "system"
        if isinstance(item.get("content"), list) and item["role"] not in TEXT_PART_ROLES.get(case.name, ()):
            item["content"] = "\n".join(part["text"] for part in item["content"])
        if item["role"] == "assistant":
            item.setdefault("content", None)
        if "tool_calls" in item and not item["tool_calls"]:
            del item["tool_calls"]  # null or []: no calls (templates testing the key would render an empty block)
        if "tool_calls" in item:
            item["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": call["function"]["arguments"]
                                      if case.string_arguments else json.loads(call["function"]["arguments"])}}
                for call in item["tool_calls"]]
        converted.append(item)
    return converted


def control_tokens(hf) -> tuple[str, ...]:
    """The markers Helios keeps literal in client text: special or markup added tokens (a superset of
    transformers' default, the special tokens and those the template holds)."""
    return tuple(sorted(token.content for token in hf.added_tokens_decoder.values() if is_marker(token)))


def reference(case: FamilyCase, hf, body: dict, developer_as_system: bool) -> tuple[str, list[int], bool]:
    """(text, ids, whether client text held a control token) transformers renders for the request, with
    ``sanitize_control_tokens``; raises where its template does. The messages are rendered as given
    (`render_jinja_template`): `apply_chat_template` would drop a null content."""
    tools = body.get("tools") or None
    messages = reference_messages(case, body["messages"], developer_as_system)
    control, marked = chat_template_utils._get_control_token_patterns(control_tokens(hf))
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if (effort := body.get("reasoning_effort")) is not None:  # the template's own argument, and its switch
        if "Reasoning: " in hf.chat_template and effort not in GRADED_EFFORTS:
            raise ValueError(f"gpt-oss grades no effort {effort!r}")  # as OpenAI refuses an unsupported effort
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" in hf.chat_template:
            kwargs["enable_thinking"] = effort != "none"
        elif "thinking is defined" in hf.chat_template:  # DeepSeek-V3.1's switch
            kwargs["thinking"] = effort != "none"
    messages, tools, kwargs = chat_template_utils.mark_control_tokens([messages, tools, kwargs], control)
    continued = bool(body.get("continue_final_message"))  # vLLM's prefill: no generation prompt
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=hf.chat_template, add_generation_prompt=not continued,
        continue_final_message=continued, **{**hf.special_tokens_map, **kwargs})
    text = rendered[0]
    plain = marked.sub(lambda match: match.group(1) or "", text)
    return plain, chat_template_utils.encode_marked_chat(hf, text), plain != text


# --- the family frontends ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family(request, tmp_path_factory, qwen_tokenizer, deepseek_tokenizer):
    case: FamilyCase = request.param
    tokenizer, core = prepared_family_core(case, tmp_path_factory.getbasetemp(), qwen_tokenizer, deepseek_tokenizer)
    served = served_tokenizer(core.read_resource(resource_of_kind(core, "TOKENIZER")).decode("utf-8"))
    template = core.read_resource(resource_of_kind(core, "CHAT_TEMPLATE")).decode("utf-8")
    frontend = FrontendModel.from_contract(core.prepared, served, template)
    return case, frontend, hf_tokenizer(case, tokenizer)


def prompt_of(frontend, body: dict):
    """The prepared prompt ids, or the RequestError the server answers with a 400."""
    request = ChatCompletionRequest.model_validate(body)
    try:
        return list(frontend.prepare_chat(request, request_id="fuzz").prompt_token_ids), None
    except RequestError as error:
        return None, error


def check_request(family, body: dict) -> None:
    case, frontend, hf = family
    try:
        developer_as_system = Role.DEVELOPER not in frontend.syntax.prompt_rules.declared_roles
        expected_text, expected_ids, has_markers = reference(case, hf, body, developer_as_system)
        failure = None
    except Exception as error:  # the reference template refuses the conversation
        failure = error
    served_ids, refusal = prompt_of(frontend, body)
    where = json.dumps(body, ensure_ascii=False)
    if failure is not None:
        assert refusal is not None, f"the reference raised {failure!r}; Helios rendered a prompt for {where}"
        assert str(refusal) and refusal.param in ("messages", "tools", "chat_template_kwargs", "reasoning_effort"), (
            refusal, where)
        return
    assert refusal is None, f"Helios refused ({refusal}) what the reference renders: {where}"
    if served_ids == expected_ids:
        return
    served_text = hf.decode(served_ids, skip_special_tokens=False)
    assert served_text == expected_text, f"texts differ at {_difference(served_text, expected_text)}: {where}"
    assert has_markers, f"same text, other ids: {where}\n{served_ids}\n{expected_ids}"
    controls = {hf.convert_tokens_to_ids(token) for token in control_tokens(hf)}
    assert Counter(i for i in served_ids if i in controls) == Counter(i for i in expected_ids if i in controls), where


def _difference(served: str, expected: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(served, expected)) if a != b), min(len(served), len(expected)))
    return f"served {served[max(at - 30, 0):at + 40]!r} expected {expected[max(at - 30, 0):at + 40]!r}"


@pytest.mark.parametrize("markers", [False, True], ids=["plain", "markers"])
def test_random_conversations_render_as_transformers_does(family, markers):
    case = family[0]
    for seed in range(CONVERSATIONS_PER_FAMILY):
        check_request(family, draw_request(case, seed * 2 + markers, markers))


@pytest.mark.parametrize("markers", [False, True], ids=["plain", "markers"])
def test_a_continued_final_message_renders_as_transformers_does(family, markers):
    """``continue_final_message`` (vLLM's assistant prefill): drawn conversations ending in an
    assistant message with text, the prompt cut right after that text as transformers cuts it
    (``apply_chat_template(..., continue_final_message=True)``), or refused where it refuses."""
    case = family[0]
    for seed in range(CONVERSATIONS_PER_FAMILY // 4):
        body = draw_request(case, 1000 + seed * 2 + markers, markers)
        draw = Draw(seed, markers)
        if body["messages"][-1]["role"] != "assistant" or body["messages"][-1].get("tool_calls"):
            body["messages"].append({"role": "assistant", "content": draw.content(marker_ok=False)})
        body["continue_final_message"] = True
        check_request(family, body)


def test_a_tool_result_may_name_its_function(family):
    """OpenAI's examples and many clients send the called function's `name` with a tool result."""
    case = family[0]
    call = {"id": "abcdefghi", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS[2]}}
    body = {"model": case.name, "max_tokens": 1, "tools": [tool], "messages": [
        {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "sunny"}]}
    check_request(family, body)
    assert prompt_of(family[1], body)[1] is None


def test_the_tool_result_name_reaches_the_template(qwen_tokenizer):
    template = ChatTemplate("{% for m in messages %}{{ m.role }}={{ m.name or '-' }};{% endfor %}")
    builder = PromptBuilder(template, qwen_tokenizer, PromptRules("<|im_start|>", "assistant\n", ("<|im_end|>",)))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    prompt = builder.build([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}])
    assert prompt.text == "user=-;assistant=-;tool=get_weather;"


def test_reasoning_effort_reaches_a_template_that_grades_it(family):
    """gpt-oss's template reads `reasoning_effort` (``Reasoning: high``), not `enable_thinking`: the
    request's effort is its argument, as transformers passes it, where it is one of the grades the
    template knows (an unsupported effort is a 400, as OpenAI's); the others render as before."""
    case, frontend, _ = family
    body = {"model": case.name, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
            "reasoning_effort": "high"}
    check_request(family, body)
    text = frontend.prepare_chat(ChatCompletionRequest.model_validate(body), request_id="e").prompt.text
    assert ("Reasoning: high" in text) is (case.name == "harmony")
    conflicting = {**body, "chat_template_kwargs": {"reasoning_effort": "low"}}
    refusal = prompt_of(frontend, conflicting)[1]
    if case.name == "harmony":
        assert isinstance(refusal, ReasoningEffortConflict) and refusal.param == "reasoning_effort", refusal
    for effort in ("none", "minimal", "xhigh", "max"):  # "Reasoning: max" was rendered, a prompt gpt-oss never saw
        ungraded = {**body, "reasoning_effort": effort}
        check_request(family, ungraded)
        refusal = prompt_of(frontend, ungraded)[1]
        if case.name == "harmony":
            assert isinstance(refusal, UngradedReasoningEffort) and refusal.param == "reasoning_effort", refusal
            assert "low, medium or high" in str(refusal)
        else:
            assert refusal is None, refusal


# Families whose template switches its think tags: Qwen3's and GLM's `enable_thinking`, DeepSeek-V3.1's `thinking`.
THINKING_SWITCHES = {"hermes": "enable_thinking", "glm-4.5": "enable_thinking", "deepseek-v3.1": "thinking"}


def test_reasoning_effort_sets_the_family_s_thinking_switch(family):
    """``none`` closes reasoning in the generation prompt of every family whose template switches
    it, any other effort leaves it to the model, whatever the switch's name (DeepSeek-V3.1's effort
    reached no template argument: it answered without reasoning); the prompts are the reference's."""
    case, frontend, _ = family
    states = {}
    for effort in ("none", "high"):
        body = {"model": case.name, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
                "reasoning_effort": effort}
        check_request(family, body)  # the reference's prompt, or its refusal (gpt-oss grades no "none")
        if prompt_of(frontend, body)[1] is None:
            request = ChatCompletionRequest.model_validate(body)
            states[effort] = frontend.prepare_chat(request, request_id="e").prompt.reasoning_state
    if case.name == "harmony":  # graded, not switched: test_reasoning_effort_reaches_a_template_that_grades_it
        assert list(states) == ["high"], states
    elif case.name in THINKING_SWITCHES:
        assert states["none"] is ReasoningState.CLOSED and states["high"] is not ReasoningState.CLOSED, states
        conflicting = {**body, "chat_template_kwargs": {THINKING_SWITCHES[case.name]: False}}
        refusal = prompt_of(frontend, conflicting)[1]
        assert isinstance(refusal, ReasoningEffortConflict) and refusal.param == "reasoning_effort", refusal
    else:
        assert states["none"] is states["high"]


# gpt-oss's published template reads an assistant's reasoning as `thinking` (transformers aliases it).
READS_THINKING = (
    "{%- for message in messages %}{%- if message.role == 'assistant' %}{%- if 'thinking' in message %}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>{%- endif %}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>{%- else %}"
    "<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{%- endif %}{%- endfor %}"
)


def test_reasoning_content_reaches_a_template_that_reads_thinking(qwen_tokenizer):
    rules = PromptRules("<|start|>", "assistant", ("<|end|>",))
    builder = PromptBuilder(ChatTemplate(READS_THINKING), qwen_tokenizer, rules)
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "Add."},
                {"role": "user", "content": "And 3+3?"}]
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], chat_template=READS_THINKING, add_generation_prompt=True)
    assert builder.build(messages).text == rendered[0]
    assert "<|channel|>analysis<|message|>Add.<|end|>" in rendered[0]


def test_reasoning_under_vllm_s_newer_name_is_reasoning_content(qwen_tokenizer):
    """An assistant history message's `reasoning` (vLLM's newer name) was a 400 ("fields an
    assistant message does not take"); it renders as `reasoning_content`, and the two differing is a 400."""
    rules = PromptRules("<|start|>", "assistant", ("<|end|>",))
    builder = PromptBuilder(ChatTemplate(READS_THINKING), qwen_tokenizer, rules)

    def history(**reasoning):
        return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", **reasoning},
                {"role": "user", "content": "And 3+3?"}]

    expected = builder.build(history(reasoning_content="Add.")).text
    assert builder.build(history(reasoning="Add.")).text == expected
    assert builder.build(history(reasoning="Add.", reasoning_content="Add.")).text == expected
    with pytest.raises(MessageError, match=r"messages\[1\]: reasoning and reasoning_content differ"):
        builder.build(history(reasoning="Add.", reasoning_content="Sum."))


REFUSES_SYSTEM = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('no system messages') }}{% endif %}"
    "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}"
    "{% endfor %}{% endfor %}"
)


def test_a_refused_rendering_names_the_field_at_fault(qwen_tokenizer):
    """The 400 of a conversation the template refuses names messages; of arguments no template takes,
    chat_template_kwargs; of a tool call's arguments escaping a lone surrogate, messages."""
    builder = PromptBuilder(ChatTemplate(REFUSES_SYSTEM), qwen_tokenizer,
                            PromptRules("<|im_start|>", "assistant\n", ("<|im_end|>",)))
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"s": "\\ud800"}'}}
    refused = [
        ([{"role": "system", "content": "s"}], None, "messages", "no system messages"),
        ([{"role": "user", "content": "u"}], {"messages": []}, "chat_template_kwargs", "may not set"),
        # vLLM's rendering options are accepted here (test_continue_final_message), as booleans only
        ([{"role": "user", "content": "u"}], {"add_generation_prompt": 0}, "chat_template_kwargs", "must be a boolean"),
        # jinja2's globals and a template's `self`: "'int' object is not callable", naming messages, before
        ([{"role": "user", "content": "u"}], {"namespace": 1}, "chat_template_kwargs", "may not set 'namespace'"),
        ([{"role": "user", "content": "u"}], {"self": 1}, "chat_template_kwargs", "may not set 'self'"),
        ([{"role": "user", "content": "u"}], {"x": [1]}, "chat_template_kwargs", "boolean, number, string"),
        ([{"role": "assistant", "tool_calls": [call]}], None, "messages", "lone surrogate"),
    ]
    for messages, kwargs, param, message in refused:
        with pytest.raises(RequestError, match=message) as raised:
            builder.build(messages, template_kwargs=kwargs)
        assert raised.value.param == param
