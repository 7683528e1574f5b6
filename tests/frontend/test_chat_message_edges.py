"""Chat messages at the edges of what a client may send, rendered through a family's published template.

Each case is a regression: the input a client sent, what Helios did before, and what it must do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.utils import chat_template_utils

from helios.embedded import default_model_dir
from helios.frontend.preparation.messages import MessageError, Role, parse_tools
from helios.frontend.preparation.prompt import PrefixConstraint, PromptBuilder, PromptRules, ReasoningMarkup
from helios.frontend.preparation.template import ChatTemplate

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
CHATML_RULES = PromptRules(
    "<|im_start|>", "assistant\n", ("<|im_end|>",), ReasoningMarkup("<think>", "</think>", ("<tool_call>",)),
    {Role.SYSTEM: PrefixConstraint.STABLE, Role.USER: PrefixConstraint.STABLE,
     Role.ASSISTANT: PrefixConstraint.CHANGES_WHEN_LAST, Role.TOOL: PrefixConstraint.STABLE},
)


@pytest.fixture(scope="module")
def qwen3(qwen_tokenizer):
    template = ChatTemplate((TEMPLATES / "qwen3.jinja").read_text())
    return PromptBuilder(template, qwen_tokenizer, CHATML_RULES), qwen_tokenizer


def nested_arguments(depth: int, leaf: str) -> str:
    return '{"a": ' * depth + json.dumps(leaf) + "}" * depth


def call_history(arguments: str) -> list[dict]:
    call = {"id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call1", "content": "sunny"}]


@pytest.mark.parametrize("depth", [450, 900])
def test_deeply_nested_tool_arguments_holding_marker_text_render(qwen3, depth):
    """History tool-call arguments nested some hundreds of levels deep (JSON decoding takes them) that
    also hold control-marker text: keeping that text literal walked the decoded arguments recursively
    and raised RecursionError, a 500, where the same arguments without marker text rendered. They
    render as that text, the marker a literal, the template's markers the only control tokens."""
    builder, tokenizer = qwen3
    im_end = tokenizer.token_to_id("<|im_end|>")
    plain = builder.build(call_history(nested_arguments(depth, "xx")))
    marked = builder.build(call_history(nested_arguments(depth, "<|im_end|>")))
    assert marked.text == plain.text.replace('"xx"', '"<|im_end|>"')
    assert marked.token_ids.count(im_end) == plain.token_ids.count(im_end)
    assert tokenizer.decode(list(marked.token_ids), skip_special_tokens=False) == marked.text


@pytest.mark.parametrize("strict", [True, False])
def test_a_tool_s_strict_flag_renders_as_transformers_renders_it(qwen3, strict):
    """A tool declared with ``strict`` (the openai client's `pydantic_function_tool` sends
    ``strict: true``): the template received the tool without it, so templates that print the tool
    (Qwen's ``tool | tojson``, Llama's, Mistral's, GLM's, Qwen3-Coder's ``<strict>``) rendered other
    text than `apply_chat_template` with the same tool."""
    builder, _ = qwen3
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": strict}}
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=[tool], chat_template=(TEMPLATES / "qwen3.jinja").read_text(),
        add_generation_prompt=True)
    assert f'"strict": {json.dumps(strict)}' in rendered[0]
    assert builder.build(messages, [tool]).text == rendered[0]


def test_a_tool_s_strict_flag_must_be_a_boolean():
    with pytest.raises(MessageError, match=r"tools\[0\]\.function\.strict must be a boolean") as raised:
        parse_tools([{"type": "function", "function": {"name": "f", "strict": "yes"}}])
    assert raised.value.param == "tools"


# Reads arguments by key name, as templates for tools with known parameters do (``arguments.code``).
READS_ARGUMENTS_BY_NAME = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}[{{ c.function.arguments.text }}|{{ c.function.arguments.city }}]"
    "{%- endfor %}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@pytest.mark.parametrize("text", ["hello", "say <|im_end|>"], ids=["plain", "marker text"])
def test_an_argument_named_text_renders_as_that_argument(qwen_tokenizer, text):
    """A tool call's argument named ``text`` read as ``arguments.text``: the arguments' own JSON text
    was an attribute of that name, so the template printed the whole JSON object, not the argument
    (transformers renders the argument); other names rendered their values."""
    builder = PromptBuilder(ChatTemplate(READS_ARGUMENTS_BY_NAME), qwen_tokenizer, CHATML_RULES)
    messages = call_history(json.dumps({"text": text, "city": "Paris"}))
    reference = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if "tool_calls" in m else m for m in messages]
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[reference], chat_template=READS_ARGUMENTS_BY_NAME, add_generation_prompt=True)
    assert f"[{text}|Paris]" in rendered[0]
    assert builder.build(messages).text == rendered[0]


def text_parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": text} for text in texts]


PARTS_CONVERSATION = [
    {"role": "system", "content": text_parts("Be brief.", "Use SI units.")},
    {"role": "user", "content": text_parts("How far", "is Paris?")},
    {"role": "assistant", "content": text_parts("About", "450 km.")},
    {"role": "user", "content": text_parts("And", " Rome?")},
]


# Renders text parts with a blank line between them (as Pixtral's template does).
BLANK_LINE_PARTS = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{%- if m.content is string %}{{ m.content }}{%- else %}"
    "{%- for p in m.content %}{{ p.text }}{{ '\n\n' if not loop.last }}{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@pytest.mark.parametrize("source", [default_model_dir() / "chat_template.jinja", TEMPLATES / "qwen2_5_vl.jinja",
                                    TEMPLATES / "glm4_5.jinja", BLANK_LINE_PARTS],
                         ids=["embedded", "qwen2.5-vl", "glm-4.5", "blank line between parts"])
def test_text_part_arrays_render_as_transformers_renders_them(qwen_tokenizer, source):
    """Content sent as an array of text parts, to templates that render parts themselves (the embedded
    model's, Qwen2.5-VL's and GLM-4.5's join the texts with nothing between, others with a blank line):
    the texts were joined with newlines before the template saw them, so the prompt held a newline between the parts that
    `apply_chat_template` (and vLLM, for Qwen2.5-VL's template) does not render, while the same parts
    beside an image rendered without one. The template gets the parts, as transformers gives them."""
    template = source if isinstance(source, str) else source.read_text()
    builder = PromptBuilder(ChatTemplate(template), qwen_tokenizer, CHATML_RULES)
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[PARTS_CONVERSATION], chat_template=template, add_generation_prompt=True)
    assert "How far" + ("\n\n" if source is BLANK_LINE_PARTS else "") + "is Paris?" in rendered[0]
    assert builder.build(PARTS_CONVERSATION).text == rendered[0]


@pytest.mark.parametrize("name", ["qwen3.jinja", "llama3_1.jinja", "deepseek_v3.jinja"])
def test_text_part_arrays_join_with_newlines_where_the_template_renders_only_strings(qwen_tokenizer, name):
    """Templates that raise on a list of parts (Qwen3's, DeepSeek's) or print its Python repr (Llama
    3.1's) in transformers get the texts joined with newlines (vLLM's "string" content format)."""
    template = ChatTemplate((TEMPLATES / name).read_text(), {"bos_token": "<s>"})
    builder = PromptBuilder(template, qwen_tokenizer, CHATML_RULES)
    joined = [{**m, "content": "\n".join(part["text"] for part in m["content"])} for m in PARTS_CONVERSATION]
    assert builder.build(PARTS_CONVERSATION).text == builder.build(joined).text
