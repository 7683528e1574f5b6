"""Client mistakes the frontend answered as if they made sense, or blamed on the core (session 68).

- Tools whose parameter schemas, within the schema bounds and the 4 MiB body, print past the chat
  template's 64 Mi-character render bound once indented (Llama 3 prints each tool with
  ``tojson(indent=4)``): the render stopped with `TemplateLimitError`, a 500 blaming the core's
  template; now a 400 naming ``tools`` before anything is rendered.
- A text completion's prompt holding the image placeholder (``<|image_pad|>``, as text or as an id)
  reached a vision model as a feature slot with no image behind it; `check_completion_prompt`
  refuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.errors import RequestError
from helios.frontend.images.decode import ImageLimits
from helios.frontend.images.layout import LayoutParams
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.images.preparation import PreparationParams
from helios.frontend.preparation.messages import indented_json_chars
from helios.frontend.preparation.prompt import PromptBuilder, PromptRules
from helios.frontend.preparation.template import ChatTemplate
from helios.server.schemas import MAX_TOOLS, ChatCompletionRequest

LLAMA3 = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "llama3_1.jinja"
IMAGE_PAD = 151655


@pytest.fixture(scope="module")
def llama3_builder(qwen_tokenizer):
    rules = PromptRules("<|start_header_id|>", "assistant<|end_header_id|>\n\n", ("<|eot_id|>",))
    return PromptBuilder(ChatTemplate(LLAMA3.read_text(), {"bos_token": "<|begin_of_text|>"}), qwen_tokenizer, rules)


def _nested(depth: int, leaf: list) -> list:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _tools(num_tools: int, parameters: dict) -> list[dict]:
    """Tools as the server hands them to preparation: validated by the request schema, dumped."""
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": parameters}} for i in range(num_tools)]
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


def test_tools_that_print_past_the_render_bound_are_a_400_naming_tools(llama3_builder):
    # 128 tools of 26-deep arrays: 3.8 MB of JSON in the body, some 270 Mi characters indented
    deep = {"type": "object", "properties": {"a": {"enum": _nested(26, [0] * 15000)}}}
    tools = _tools(MAX_TOOLS, deep)
    with pytest.raises(RequestError) as raised:
        llama3_builder.build([{"role": "user", "content": "hi"}], tools)
    assert raised.value.http_status == 400 and raised.value.param == "tools", raised.value
    assert "print as more than" in str(raised.value)


def test_tools_of_an_ordinary_size_still_render(llama3_builder):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 200} for i in range(40)}}
    prompt = llama3_builder.build([{"role": "user", "content": "hi"}], _tools(MAX_TOOLS, schema))
    assert '"name": "f127"' in prompt.text


@pytest.mark.parametrize("value", [
    [], {}, "a\u00e9\n", 1.5, None,
    {"a": [1, 2, {"b": "x\u00e9", "c": [], "d": {}}], "e": {"f": [[True]]}},
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "enum": [[1, [2]], "x"]}}}],
])
def test_the_indented_size_is_what_json_dumps_prints(value):
    assert indented_json_chars(value, 4, 1 << 30) == len(json.dumps(value, indent=4, ensure_ascii=False))


def _pipeline() -> ImagePipeline:
    preparation = PreparationParams(14, 2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 3136, 12845056)
    return ImagePipeline(preparation, LayoutParams(IMAGE_PAD, 2, 112, 14), (252,), ImageLimits())


def test_a_completion_prompt_holding_the_image_placeholder_is_a_400_naming_it():
    from helios.frontend.preparation import prompt_images

    names = {IMAGE_PAD: "<|image_pad|>"}.get
    prompt_images.check_completion_prompt([9707, 1879], _pipeline(), names)  # no placeholder: served
    prompt_images.check_completion_prompt([9707, IMAGE_PAD], None, names)  # a text model: an ordinary id
    with pytest.raises(RequestError) as raised:
        prompt_images.check_completion_prompt([9707, IMAGE_PAD, 1879], _pipeline(), names)
    assert raised.value.http_status == 400 and raised.value.param == "prompt"
    assert "'<|image_pad|>' (token 151655, at prompt position 1)" in str(raised.value)
    assert "/v1/chat/completions" in str(raised.value)
