"""Serving-time bounds of the chat template: a core's template that blows up or runs on only for
some conversations (ones prepare's probes never render) fails that request with `TemplateLimitError`
(HTTP 500: the core's template is at fault) promptly, the render stops, its preparation slot is
free again and other requests keep being prepared. The serving bounds leave a wide margin over
what the packaged family templates need for the largest request the server admits."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from helios.core.template_sandbox import RenderBounds
from helios.frontend.preparation.prompt import PromptBuilder, PromptRules
from helios.frontend.preparation.template import (
    SERVING_BOUNDS, ChatTemplate, TemplateLimitError, TemplateRenderError)
from helios.server.preparation import PreparationGate, PreparationPool
from helios.server.schemas import MAX_MESSAGES

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
QUICK = RenderBounds(max_chars=1 << 20, cpu_seconds=0.3)
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPIN = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


def conversation(num_messages: int, text: str = "hello") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(num_messages)]


@pytest.mark.parametrize("trap", [
    "{% if messages|length > 4 %}{{ 'x' * 10**10 }}{% endif %}",
    "{% if messages|length > 4 %}{% for i in range(10**9) %}{% endfor %}{% endif %}",
    "{% if messages|length > 4 %}" + SPIN + "{% endif %}",
    "{% set ns = namespace(s='ab') %}{% for m in messages %}{% set ns.s = ns.s ~ ns.s ~ m.content %}{% endfor %}",
    "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s + m.content * 100 %}{% endfor %}",
], ids=["repetition", "range", "nested loops", "doubling per message", "growth from client text"])
def test_a_template_that_runs_away_only_on_larger_conversations_is_a_limit_error(trap):
    template = ChatTemplate(trap + CHATML, bounds=QUICK)
    assert template.render(conversation(3)).startswith("<|im_start|>user\nhello")  # what probes see
    big = conversation(30, "x" * 2000) if "client text" not in trap else conversation(9, "y" * 2000)
    with pytest.raises(TemplateLimitError, match="exceeded a render bound") as raised:
        template.render(big)
    assert raised.value.http_status == 500


@pytest.mark.parametrize("growth", [
    "'x'.encode() * 10**7",
    "('x' * 10**4).encode().replace('x'.encode(), ('y' * 10**3).encode())",
    "'x'.encode().center(10**7)",
    "('%' ~ 10**7 ~ 'd').encode() % 1",
    "','.encode().join(['x'.encode() * 10**4] * 10**3)",
    "('x' * 10**4).translate({120: 'y' * 10**3})",
    "('x' * 10**4).translate(['y' * 10**3] * 200)",
], ids=["bytes repetition", "bytes replace", "bytes width", "bytes format", "bytes join", "translate",
        "translate by list"])
def test_bytes_and_translations_are_bounded_as_strings_are(growth):
    """``'x'.encode()`` is bytes, which no bound weighed (``'x'.encode() * 10**11`` built 100 GB in one
    step: a MemoryError, a 500, or the server killed), and `str.translate` maps a character to a string
    of any length (n copies of it in one call). Both are refused before they build past the cap."""
    template = ChatTemplate("{{ (" + growth + ") | length }}", bounds=QUICK)
    with pytest.raises(TemplateLimitError, match="exceeded a render bound"):
        template.render([])
    small = growth.replace("10**7", "10").replace("10**4", "10").replace("10**3", "2")
    assert int(ChatTemplate("{{ (" + small + ") | length }}", bounds=QUICK).render([])) > 0


def test_template_errors_on_request_data_stay_client_errors():
    template = ChatTemplate("{{ raise_exception('no system role') if messages[0].role == 'system' }}" + CHATML)
    with pytest.raises(TemplateRenderError) as raised:
        template.render([{"role": "system", "content": "s"}])
    assert raised.value.http_status == 400


def test_the_prompt_builder_fails_the_request_with_the_limit_error(qwen_tokenizer):
    rules = PromptRules("<|im_start|>", "assistant\n", ("<|im_end|>",))
    template = ChatTemplate("{% if messages|length > 4 %}" + SPIN + "{% endif %}" + CHATML, bounds=QUICK)
    builder = PromptBuilder(template, qwen_tokenizer, rules)
    assert builder.build(conversation(3)).text.endswith("<|im_start|>assistant\n")
    with pytest.raises(TemplateLimitError):
        builder.build(conversation(7))


def test_a_runaway_render_frees_its_preparation_slot_and_stops():
    """One preparation slot: the runaway request gets the limit error within the default serving
    bound (well before the gate's 10 s timeout), the next request is prepared at once, and no
    render keeps burning CPU afterwards."""
    template = ChatTemplate("{% if messages|length > 4 %}" + SPIN + "{% endif %}" + CHATML)

    async def scenario():
        gate = PreparationGate(PreparationPool(1), 1, timeout_s=10.0)
        try:
            start = time.monotonic()
            with pytest.raises(TemplateLimitError, match="CPU time"):
                await gate.run(template.render, conversation(7), compiles=False)
            failed_after = time.monotonic() - start
            cpu = time.process_time()
            # the one slot is free: not queued behind the gate's 10 s timeout (wait_for fails first)
            text = await asyncio.wait_for(gate.run(template.render, conversation(1), compiles=False), 5.0)
            await asyncio.sleep(0.5)
            return failed_after, text, time.process_time() - cpu
        finally:
            gate.close()

    failed_after, text, cpu_since = asyncio.run(scenario())
    assert failed_after >= SERVING_BOUNDS.cpu_seconds  # stopped by its CPU-time bound (no upper wall bound: CI is loaded)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert cpu_since < 0.3  # nothing spins on in the background


@pytest.mark.parametrize("name", ["qwen3.jinja", "deepseek_v3.jinja", "llama3_1.jinja", "glm4_5.jinja",
                                  "mistral_v0_3.jinja", "gpt_oss.jinja"])
def test_the_largest_admitted_request_renders_far_inside_the_serving_bounds(name):
    """MAX_MESSAGES messages in a 4 MiB body (the default body cap) through each packaged family
    template renders within the serving bounds, its text under a tenth of the size bound."""
    template = ChatTemplate((TEMPLATES / name).read_text(), {"bos_token": "<s>", "eos_token": "</s>"})
    messages = conversation(MAX_MESSAGES - 1, "x" * ((4 << 20) // MAX_MESSAGES))
    text = template.render(messages)  # raises TemplateLimitError past either bound
    assert len(text) < SERVING_BOUNDS.max_chars / 10
