"""Parsing and validating completions in the model's answer and tool-call syntax."""

from __future__ import annotations

from default_model_eval import parse_output, typed_arguments

from helios.embedded import default_tools

CALL = (
    "<tool_call>\n<function=convert_currency>\n<parameter=amount>\n12.5\n</parameter>\n"
    "<parameter=from>\nUSD\n</parameter>\n<parameter=to>\nEUR\n</parameter>\n</function>\n</tool_call><|im_end|>"
)


def test_answer_with_reasoning_parses():
    parsed = parse_output("<think>\n2+2=4\n</think>\n\n2 + 2 = 4.<|im_end|>")
    assert (parsed.well_formed, parsed.reasoning, parsed.content) == (True, "2+2=4", "2 + 2 = 4.")


def test_malformed_answers_do_not_parse():
    for text in (
        "2 + 2 = 4.<|im_end|>",  # no reasoning
        "<think>\n\n</think>\n\n4<|im_end|>",  # empty reasoning
        "<think>\nx\n</think>\n\n4",  # never stopped
        "<think>\nx\n</think>\n\n4</think><|im_end|>",  # markup in the answer
    ):
        assert not parse_output(text).well_formed, text


def test_tool_call_parses_and_validates_against_the_schema():
    parsed = parse_output(CALL)
    assert parsed.call == ("convert_currency", (("amount", "12.5"), ("from", "USD"), ("to", "EUR")))
    assert typed_arguments(parsed.call, default_tools()) == {"amount": 12.5, "from": "USD", "to": "EUR"}


def test_schema_violations_are_invalid():
    tools = default_tools()
    assert typed_arguments(("convert_currency", (("amount", "lots"), ("from", "USD"), ("to", "EUR"))), tools) is None
    assert typed_arguments(("convert_currency", (("amount", "1"), ("from", "USD"))), tools) is None
    assert typed_arguments(("get_weather", (("city", "Oslo"), ("country", "NO"))), tools) is None
    assert typed_arguments(("get_weather", (("city", "Oslo"), ("city", "Rome"))), tools) is None
    assert typed_arguments(("send_email", (("to", "x"),)), tools) is None
    assert typed_arguments(("get_weather", (("city", "Oslo"),)), tools) == {"city": "Oslo"}


def test_reference_completions_score_perfectly():
    import default_model_data as data
    from default_model_eval import eval_items, score
    from default_model_render import ChatRenderer, load_template_text

    renderer = ChatRenderer(load_template_text())
    conversations = data.heldout_conversations(3, 8, default_tools(), set())
    references = []
    for conversation in conversations:
        for index in conversation.target_indices:
            prompt = renderer.render(conversation.messages[:index], conversation.tools, add_generation_prompt=True)
            through = renderer.render(conversation.messages[: index + 1], conversation.tools)
            references.append(through[len(prompt):].removesuffix("\n"))
    scores = score(eval_items(conversations), references)
    assert set(scores.values()) == {1.0}
    assert {"ARITHMETIC exact answer", "TOOL CALL valid (right tool, schema-valid args)"} <= set(scores)
