"""Thinking switches and reasoning output on real tokenizers and the families' published templates.

``reasoning_effort`` sets the family's thinking switch, whatever its name (`client_fields`), and the
reasoning parser then starts where the rendered generation prompt leaves it: inside reasoning when
the prompt opened it, in the answer when the prompt closed it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.frontend.preparation.client_fields import (
    ReasoningEffortConflict, UngradedReasoningEffort, effective_template_kwargs, thinking_switch_of)
from helios.frontend.preparation.prompt import ReasoningState
from helios.server.schemas import ChatCompletionRequest

from .served import deepseek_model, ids_of, run_output

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"


def chat(served, **fields):
    body = {"model": served.served_id, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize("template, switch", [
    ("qwen3.jinja", "enable_thinking"), ("glm4_5.jinja", "enable_thinking"), ("deepseek_v3_1.jinja", "thinking"),
    ("gpt_oss.jinja", "reasoning_effort"), ("deepseek_v3.jinja", None), ("llama3_1.jinja", None),
])
def test_the_thinking_switch_is_the_argument_the_published_template_reads(template, switch):
    """DeepSeek-V3.1 reads ``thinking``; gpt-oss reads ``message.thinking``, a message field, and
    ``reasoning_effort``, its switch."""
    assert thinking_switch_of((TEMPLATES / template).read_text()) == switch


def test_reasoning_effort_sets_deepseek_s_thinking_switch(deepseek_tokenizer):
    """A DeepSeek-V3.1-style template reads ``thinking`` (not ``enable_thinking``): an effort turned
    thinking on only through ``chat_template_kwargs``, so ``reasoning_effort: high`` answered
    without reasoning and its reasoning came back as content."""
    model = deepseek_model(deepseek_tokenizer)
    eos = deepseek_tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    output = ids_of(deepseek_tokenizer, "Sunny, so", "</think>", "It is sunny.") + [eos]
    for effort in ("low", "high", "max"):
        prepared = model.prepare_chat(chat(model, reasoning_effort=effort))
        assert prepared.prompt.text.endswith("<｜Assistant｜><think>")
        assert prepared.prompt.reasoning_state is ReasoningState.OPEN
        result = run_output(prepared, output)[1].result
        assert (result.reasoning, result.content) == ("Sunny, so", "It is sunny.")
    off = model.prepare_chat(chat(model, reasoning_effort="none"))
    assert off.prompt.text.endswith("<｜Assistant｜></think>") and off.prompt.reasoning_state is ReasoningState.CLOSED
    result = run_output(off, ids_of(deepseek_tokenizer, "It is sunny.") + [eos])[1].result
    assert (result.reasoning, result.content) == ("", "It is sunny.")
    agreeing = model.prepare_chat(chat(model, reasoning_effort="high", chat_template_kwargs={"thinking": True}))
    assert agreeing.prompt_token_ids == model.prepare_chat(chat(model, reasoning_effort="high")).prompt_token_ids
    with pytest.raises(ReasoningEffortConflict, match="chat_template_kwargs.thinking") as refusal:
        model.prepare_chat(chat(model, reasoning_effort="high", chat_template_kwargs={"thinking": False}))
    assert refusal.value.param == "reasoning_effort"



@pytest.mark.parametrize("effort", ["none", "minimal", "xhigh", "max"])
def test_an_effort_a_graded_template_does_not_know_is_a_400(effort):
    """gpt-oss's template prints its ``reasoning_effort`` argument (``Reasoning: low|medium|high``);
    ``Reasoning: none`` or ``Reasoning: max`` was rendered as given, a prompt the model was never
    trained on. OpenAI refuses an effort the model does not support: so does Helios, naming the field."""
    switch = thinking_switch_of((TEMPLATES / "gpt_oss.jinja").read_text())
    with pytest.raises(UngradedReasoningEffort, match="low, medium or high") as refusal:
        effective_template_kwargs(effort, None, switch)
    assert refusal.value.param == "reasoning_effort"
    assert effective_template_kwargs("low", {"x": 1}, switch) == {"x": 1, "reasoning_effort": "low"}
    assert effective_template_kwargs(effort, None, "enable_thinking") == {"enable_thinking": effort != "none"}
