"""The Hugging Face chat-template dialect in Helios's bounded sandbox: what published templates use
renders as transformers' `apply_chat_template` renders it, at serving (`ChatTemplate`) and in
prepare's probes (`ProbeTemplate`), and the dialect's globals stay within the render bounds."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from helios.core.template_sandbox import RenderLimitExceeded
from helios.frontend.preparation.prompt import PromptBuilder, PromptRules
from helios.frontend.preparation.template import ChatTemplate, TemplateLimitError, TemplateLoadError, TemplateRenderError
from helios.ignition.frontend.render import ProbeTemplate

# transformers' `{% generation %}` tag marks the assistant's own text (return_assistant_tokens_mask);
# templates trained for assistant-only loss carry it, with or without whitespace control.
GENERATION = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n"
    "{%- if message.role == 'assistant' -%}{% generation %}{{ loop.index }}:{{ message.content }}"
    "{% set inner = 1 %}{% if loop.last %}!{% endif %}<|im_end|>{% endgeneration %}{{ inner is defined }}\n"
    "{%- else -%}{{ message.content }}<|im_end|>\n{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
CONVERSATION = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": " d "}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("source", [
    GENERATION, GENERATION.replace("{% generation %}", "{%- generation -%}\n  ").replace(
        "{% endgeneration %}", "\n{%- endgeneration -%}"),
], ids=["plain", "whitespace control"])
def test_generation_blocks_render_their_body_as_transformers_does(source):
    """They did not compile ("unknown tag 'generation'"): such a checkpoint could not be prepared."""
    rendered, _ = render_jinja_template(conversations=[CONVERSATION], chat_template=source, add_generation_prompt=True)
    assert "2:b<|im_end|>False" in rendered[0]  # the body is its own scope, as transformers parses it
    assert ChatTemplate(source).render(CONVERSATION, add_generation_prompt=True) == rendered[0]
    assert ProbeTemplate(source, {}).render(CONVERSATION, add_generation_prompt=True) == rendered[0]


def test_a_date_format_that_would_build_a_huge_text_is_refused_before_it_is_built():
    """One strftime call builds up to 256 characters per format character: ``'%c' * 30000000`` took
    16 s of CPU and 4 GB in one step, past both bounds, which no step count stops."""
    huge = "{{ strftime_now('%c' * 600000) | length }}"  # 14.4 M characters of dates
    with pytest.raises(TemplateLimitError, match="a date format of 1200000 characters"):
        ChatTemplate(huge).render([])
    with pytest.raises(RenderLimitExceeded, match="a date format of 1200000 characters"):
        ProbeTemplate(huge, {}).render([])
    assert ProbeTemplate("{{ strftime_now('%d %b %Y') }}", {}).render([]) == "26 Jul 2024"
    assert len(ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])) == 10


@pytest.mark.parametrize("failing", [
    "'x'.encode('no-such-codec')", "'xyz' | truncate(1)", "cycler().next()", "1e400 | int", "2.0 ** 5000",
])
def test_a_template_that_fails_in_jinja_s_own_code_on_a_request_refuses_it(deepseek_tokenizer, failing):
    """A template that fails only for some requests (here, those with tools) through one of jinja's own
    pieces: transformers' render raises, as for a `raise_exception`, and the request is refused with a
    400 naming the messages; a LookupError, AssertionError, RuntimeError or NameError escaped as a 500."""
    source = "{% if tools %}{{ " + failing + " }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(Exception):
        render_jinja_template(conversations=[CONVERSATION[:1]], tools=[TOOL], chat_template=source)
    rules = PromptRules("<｜User｜>", "<｜Assistant｜>", ("<｜end▁of▁sentence｜>",))
    builder = PromptBuilder(ChatTemplate(source), deepseek_tokenizer, rules)
    assert builder.build(CONVERSATION[:1]).text == "a"
    with pytest.raises(TemplateRenderError, match="chat template failed") as raised:
        builder.build(CONVERSATION[:1], [TOOL])
    assert raised.value.param == "messages"


@pytest.mark.parametrize("source", [
    "{% for a in b %}" * 101 + "{% endfor %}" * 101, "{{ " + "(" * 2000 + "1" + ")" * 2000 + " }}",
], ids=["nested loops", "nested parentheses"])
def test_a_template_nested_past_the_compilers_depth_is_a_load_error(source):
    """A template nested deeper than jinja's parser or Python's compiler go (a RecursionError or a
    SyntaxError, not a TemplateError) escaped `ChatTemplate` as a traceback at startup, where prepare's
    `ProbeTemplate` names it; it is the typed `TemplateLoadError`."""
    with pytest.raises(TemplateLoadError, match="chat template does not compile"):
        ChatTemplate(source)
