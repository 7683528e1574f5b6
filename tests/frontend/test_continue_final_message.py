"""Assistant prefill (vLLM's ``continue_final_message`` and ``add_generation_prompt``) on the prompt path.

The reference is transformers' ``render_jinja_template(..., continue_final_message=True)``, the render
``apply_chat_template`` runs, over the published family templates (tests/fixtures/templates) and the
embedded model's; token ids come from the real Qwen and DeepSeek tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.utils import chat_template_utils

from helios.errors import RequestError
from helios.frontend.preparation.messages import Role, parse_messages, template_messages
from helios.frontend.preparation.prompt import (
    PrefixConstraint,
    PromptBuilder,
    PromptRules,
    ReasoningMarkup,
    ReasoningState,
    RenderingOptionError,
)
from helios.frontend.preparation.template import ChatTemplate, ContinuationError, TemplateRenderError

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
EMBEDDED = Path(__file__).parent.parent.parent / "src" / "helios" / "embedded" / "default_model" / "chat_template.jinja"
SOURCES = {**{path.stem: path for path in sorted(TEMPLATES.glob("*.jinja"))}, "embedded": EMBEDDED}
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}],
    "trailing_space": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, "}],
    "trailing_newline": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Steps:\n"}],
    "empty": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
    "reasoning": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Well", "reasoning_content": "The user greets."}],
    "later_turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                   {"role": "user", "content": "Again"}, {"role": "assistant", "content": "  Once more"}],
    "parts": [{"role": "user", "content": "Hi"},
              {"role": "assistant", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]}],
}

QWEN_RULES = PromptRules(
    "<|im_start|>", "assistant\n", ("<|im_end|>",), ReasoningMarkup("<think>", "</think>"),
    {role: PrefixConstraint.STABLE for role in (Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL)})


def reference(source: str, messages: list[dict], **options) -> str:
    """transformers' rendering of the same template inputs (fresh plain copies)."""
    rendered, _ = chat_template_utils.render_jinja_template(
        [json.loads(json.dumps(messages))], chat_template=source, **options, **TOKENS)
    return rendered[0]


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=list(CONVERSATIONS))
@pytest.mark.parametrize("name", SOURCES, ids=list(SOURCES))
def test_continuation_renders_as_transformers(name, conversation):
    source = SOURCES[name].read_text()
    template = ChatTemplate(source, TOKENS)
    messages = template_messages(parse_messages(CONVERSATIONS[conversation]), True, template.content_part_roles)
    expected = reference(source, messages, continue_final_message=True, add_generation_prompt=False)
    assert template.render(messages, add_generation_prompt=False, continue_final_message=True) == expected
    assert "CONTINUE_FINAL_MESSAGE_TAG" not in expected


@pytest.fixture(scope="module")
def qwen3(qwen_tokenizer):
    return PromptBuilder(ChatTemplate((TEMPLATES / "qwen3.jinja").read_text()), qwen_tokenizer, QWEN_RULES)


def test_prompt_ends_inside_the_assistant_message(qwen3, qwen_tokenizer):
    messages = CONVERSATIONS["reasoning"]
    source = (TEMPLATES / "qwen3.jinja").read_text()
    expected = reference(source, messages, continue_final_message=True, add_generation_prompt=False)
    prompt = qwen3.build(messages, continue_final_message=True)
    assert prompt.text == expected and prompt.text.endswith("</think>\n\nWell")
    assert list(prompt.token_ids) == qwen_tokenizer.encode(expected, add_special_tokens=False).ids
    # the output starts with the answer: the prefill closed reasoning
    assert prompt.reasoning_state is ReasoningState.CLOSED
    assert prompt.assistant_prefill == "<think>\nThe user greets.\n</think>\n\nWell"


def test_the_options_may_come_in_chat_template_kwargs(qwen3):
    """vLLM merges chat_template_kwargs over its request fields: either place renders the same."""
    messages = CONVERSATIONS["plain"]
    by_argument = qwen3.build(messages, continue_final_message=True)
    by_kwargs = qwen3.build(messages, template_kwargs={"continue_final_message": True, "enable_thinking": False})
    assert by_kwargs.text == by_argument.text and by_kwargs.text.endswith("The answer is")
    both = qwen3.build(messages, add_generation_prompt=False, template_kwargs={"continue_final_message": True})
    assert both.token_ids == by_argument.token_ids


def test_without_generation_prompt_renders_as_transformers(qwen3):
    messages = CONVERSATIONS["later_turn"][:3]
    source = (TEMPLATES / "qwen3.jinja").read_text()
    prompt = qwen3.build(messages, add_generation_prompt=False)
    assert prompt.text == reference(source, messages, add_generation_prompt=False)
    assert not prompt.text.rstrip().endswith("<|im_start|>assistant")


def test_the_continued_message_is_no_part_of_the_stable_prefix(qwen3, qwen_tokenizer):
    """Its text changes as the model continues it: the prefix cache may not publish a checkpoint
    inside it (every role is declared STABLE here, so only the continuation stops the prefix)."""
    messages = CONVERSATIONS["later_turn"]
    closed = qwen3.build(messages[:-1], add_generation_prompt=False)
    prompt = qwen3.build(messages, continue_final_message=True)
    assert prompt.stable_prefix_len == len(closed.token_ids)
    assert prompt.token_ids[:prompt.stable_prefix_len] == closed.token_ids
    assert len(prompt.token_ids) > prompt.stable_prefix_len


def test_deepseek_tokens_match(deepseek_tokenizer):
    source = (TEMPLATES / "deepseek_v3_1.jinja").read_text()
    tokens = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
    builder = PromptBuilder(ChatTemplate(source, tokens), deepseek_tokenizer,
                            PromptRules("", "<｜Assistant｜>", ("<｜end▁of▁sentence｜>",),
                                        ReasoningMarkup("<think>", "</think>")))
    messages = CONVERSATIONS["later_turn"]
    rendered, _ = chat_template_utils.render_jinja_template(
        [messages], chat_template=source, continue_final_message=True, **tokens)
    prompt = builder.build(messages, continue_final_message=True)
    assert prompt.text == rendered[0] and prompt.text.endswith("</think>  Once more")
    assert list(prompt.token_ids) == deepseek_tokenizer.encode(rendered[0], add_special_tokens=False).ids
    assert prompt.reasoning_state is ReasoningState.CLOSED


@pytest.mark.parametrize("options, kwargs, param", [
    ({"continue_final_message": True, "add_generation_prompt": True}, None, "continue_final_message"),
    ({"add_generation_prompt": True}, {"continue_final_message": True}, "continue_final_message"),
    ({"continue_final_message": False}, {"continue_final_message": True}, "continue_final_message"),
    ({"add_generation_prompt": True}, {"add_generation_prompt": False}, "add_generation_prompt"),
    ({}, {"continue_final_message": "yes"}, "chat_template_kwargs"),
])
def test_contradicting_options_are_refused(qwen3, options, kwargs, param):
    with pytest.raises(RequestError) as caught:
        qwen3.build(CONVERSATIONS["plain"], template_kwargs=kwargs, **options)
    assert caught.value.http_status == 400 and caught.value.param == param


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": "Hi"}], "final message .* is a user message"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
     "is a user message"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Calling",
      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "tool_calls"),
])
def test_only_an_assistant_text_continues(qwen3, messages, match):
    with pytest.raises(RenderingOptionError, match=match) as caught:
        qwen3.build(messages, continue_final_message=True)
    assert caught.value.http_status == 400 and caught.value.param == "continue_final_message"


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}",  # rewrites the text
    "{% for m in messages %}{{ m.role }}: {{ m.content[:3] }}\n{% endfor %}",  # cuts the tag off
    "{% for m in messages %}{{ m.role }}\n{% endfor %}",  # renders no content at all
])
def test_a_template_that_does_not_render_the_text_verbatim_is_a_400(qwen_tokenizer, source):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}]
    with pytest.raises(Exception) as expected:
        reference(source, messages, continue_final_message=True)
    assert isinstance(expected.value, ValueError)
    builder = PromptBuilder(ChatTemplate(source), qwen_tokenizer, PromptRules("", "assistant", ("\n",)))
    with pytest.raises(ContinuationError) as caught:
        builder.build(messages, continue_final_message=True)
    assert isinstance(caught.value, TemplateRenderError) and caught.value.http_status == 400


def test_the_rendering_options_never_reach_the_template_as_variables(qwen_tokenizer):
    template = ChatTemplate("{{ continue_final_message is defined }}|{{ add_generation_prompt }}|"
                            "{% for m in messages %}{{ m.content }}{% endfor %}")
    builder = PromptBuilder(template, qwen_tokenizer, PromptRules("", "assistant", ("\n",)))
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go"}]
    assert builder.build(messages, template_kwargs={"continue_final_message": True}).text == "False|False|HiGo"
    with pytest.raises(TemplateRenderError, match="may not set 'continue_final_message'"):
        template.render(messages, template_kwargs={"continue_final_message": True})


def test_request_text_holding_the_continuation_tag_is_refused(qwen_tokenizer):
    """A template that prints a request argument after the messages: transformers cuts the prompt at
    the argument's copy of its tag, a prompt ending after the final message's end marker."""
    template = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                            "{{ note }}")
    builder = PromptBuilder(template, qwen_tokenizer, QWEN_RULES)
    messages = CONVERSATIONS["plain"]
    assert builder.build(messages, continue_final_message=True, template_kwargs={"note": "x"}).text.endswith(
        "assistant\nThe answer is")
    with pytest.raises(ContinuationError, match="CONTINUE_FINAL_MESSAGE_TAG"):
        builder.build(messages, continue_final_message=True, template_kwargs={"note": "CONTINUE_FINAL_MESSAGE_TAG"})


# -- where the output starts: client markers in the prefill are text ----------------------------------

MARKER_PREFILL = "x <|end|> y <|start|>assistant"  # a client's literal controls, mid-message


def harmony_model():
    from frontend.parsers.conftest import HARMONY_CONTROLS, small_bpe
    from frontend.served import cached_model, harmony_frontend, served_contract
    from helios.frontend.session import FrontendModel

    tokenizer = small_bpe(["<|endoftext|>", *HARMONY_CONTROLS])
    eos = [tokenizer.token_to_id(text) for text in ("<|endoftext|>", "<|return|>", "<|call|>")]
    contract = served_contract(tokenizer.get_vocab_size(), harmony_frontend(), eos)
    source = (TEMPLATES / "gpt_oss.jinja").read_text()
    return cached_model("harmony-gpt-oss", tokenizer, lambda: FrontendModel.from_contract(contract, tokenizer, source)), tokenizer


def recipient_model():
    from frontend.parsers.conftest import small_bpe
    from frontend.served import RECIPIENT_FRAMES, cached_model, recipient_frontend, served_contract
    from helios.frontend.session import FrontendModel

    tokenizer = small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    contract = served_contract(tokenizer.get_vocab_size(), recipient_frontend(), [tokenizer.token_to_id("<|endoftext|>")])
    return cached_model("recipient-frames", tokenizer,
                        lambda: FrontendModel.from_contract(contract, tokenizer, RECIPIENT_FRAMES)), tokenizer


@pytest.mark.parametrize("family, end", [(harmony_model, "<|return|>"), (recipient_model, "<|endoftext|>")],
                         ids=["harmony", "recipient"])
def test_literal_controls_in_a_prefilled_frame_body_open_no_frame(family, end):
    """The prompt ends inside the final message's body, however the client's text spells controls:
    the continuation is that body's text (it was read as an open header, its text lost to a parse error)."""
    from frontend.served import ids_of, run_output
    from helios.server.schemas import ChatCompletionRequest

    model, tokenizer = family()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": MARKER_PREFILL}]
    body = ChatCompletionRequest.model_validate(
        {"model": model.served_id, "messages": messages, "continue_final_message": True})
    prepared = model.prepare_chat(body)
    assert prepared.prompt.text.endswith(MARKER_PREFILL)
    _, final = run_output(prepared, ids_of(tokenizer, " and more", end))
    assert (final.result.content, final.result.errors) == (" and more", ())


def test_a_literal_close_in_a_prefilled_answer_is_answer_text(qwen3, qwen_tokenizer):
    """Reasoning closed before the client's text; its literal ``</think>`` is no close delimiter, so the
    model's next ``\\n\\n`` is answer text, not the wrapping after a close (it was dropped)."""
    from google.protobuf import json_format

    from frontend.served import qwen_frontend
    from helios.contract import serving_pb2 as spb
    from helios.frontend.structured.contract_syntax import FrontendSyntax

    frontend = spb.FrontendContract(image_preparation=spb.IMAGE_PREPARATION_NONE, image_layout=spb.IMAGE_LAYOUT_NONE)
    json_format.ParseDict(qwen_frontend(qwen_tokenizer), frontend)
    syntax = FrontendSyntax.from_contract(frontend, lambda text: qwen_tokenizer.encode(text, add_special_tokens=False).ids)
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Write </think>", "reasoning_content": "Short."}]
    prompt = qwen3.build(messages, continue_final_message=True)
    assert prompt.text.endswith("</think>\n\nWrite </think>") and prompt.reasoning_state is ReasoningState.CLOSED
    assert syntax.output_start(prompt).answer_lead == ""


@pytest.mark.parametrize("content, state", [("Let me", ReasoningState.CLOSED), ("", ReasoningState.UNOPENED),
                                            (" \n", ReasoningState.UNOPENED)])
def test_a_continued_answer_opens_no_reasoning_after_its_text(qwen_tokenizer, content, state):
    """A template that writes no reasoning envelope into history (the embedded model's) left a
    continued answer's prompt "reasoning not yet opened": a grammar (json_object, a forced tool call)
    then let the output open a reasoning section after the prefilled answer text. With text the
    answer has begun; an empty or blank prefill may still open reasoning."""
    builder = PromptBuilder(ChatTemplate(EMBEDDED.read_text()), qwen_tokenizer, QWEN_RULES)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content}]
    prompt = builder.build(messages, continue_final_message=True)
    assert "<think>" not in prompt.text and prompt.reasoning_state is state
