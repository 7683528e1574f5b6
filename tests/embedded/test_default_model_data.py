"""The synthetic data generator: seeded, arithmetically right, held-out prompts kept apart."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import default_model_arithmetic as arithmetic
import default_model_data as data
import default_model_text as text

from helios.embedded import default_tools


def test_same_seed_gives_same_conversations():
    first = data.training_conversations(7, 300, default_tools())
    again = data.training_conversations(7, 300, default_tools())
    other = data.training_conversations(8, 300, default_tools())
    assert first == again
    assert first != other
    assert {c.kind for c in first} == set(data.MIXTURE)


def test_heldout_prompts_are_not_training_prompts():
    train = data.training_conversations(0, 2000, default_tools())
    seen = {c.first_user_text for c in train}
    heldout = data.heldout_conversations(0, 20, default_tools(), seen)
    assert len(heldout) == 20 * len(data.MIXTURE)
    assert not {c.first_user_text for c in heldout if c.kind in ("add", "sub", "mul")} & seen
    assert heldout == data.heldout_conversations(0, 20, default_tools(), seen)


def test_arithmetic_reasoning_and_answers_are_right():
    rng = random.Random(1)
    for _ in range(500):
        for make, op in ((arithmetic.addition, "+"), (arithmetic.subtraction, "-"), (arithmetic.multiplication, "*")):
            worked = make(rng)
            a, b = (int(x) for x in re.findall(r"\d+", worked.answer)[:2])
            assert {str(a), str(b)} <= set(re.findall(r"\d+", worked.question))
            expected = {"+": a + b, "-": a - b, "*": a * b}[op]
            assert worked.result == str(expected)
            assert worked.reasoning.endswith(f"answer: {expected}")
            assert worked.answer.endswith(f"= {expected}.")


def test_written_digits_spell_the_result():
    worked = arithmetic.addition(random.Random(5))
    digits = re.findall(r"write (\d+)", worked.reasoning)
    assert int("".join(reversed(digits))) == int(worked.result)
    assert arithmetic.subtraction_lines(512, 347) == [
        "ones: 2-7=-5, -5+10=5, write 5, borrow 1",
        "tens: 1-4-1=-4, -4+10=6, write 6, borrow 1",
        "hundreds: 5-3-1=1, write 1",
    ]
    assert arithmetic.multiplication_lines(47, 8) == ["ones: 7*8=56, write 6, carry 5", "tens: 4*8=32, 32+5=37, write 37"]


def test_unit_conversions_are_right():
    rng = random.Random(2)
    for _ in range(300):
        worked = arithmetic.metric_conversion(rng)
        value = Decimal(re.findall(r"[\d.]+", worked.question)[0])
        small = worked.answer.split(" = ")[1].split()[1].rstrip(".") in ("m", "g")
        assert Decimal(worked.result) == (value * 1000 if small else value / 1000)
        worked = arithmetic.time_conversion(rng)
        value = int(re.findall(r"\d+", worked.question)[0])
        assert int(worked.result) in (value * 60, value // 60)


def test_json_answers_hold_the_requested_keys_in_order():
    rng = random.Random(3)
    for _ in range(100):
        worked = text.json_task(rng)
        keys = re.findall(r'"(\w+)"', worked.question.split(":")[0] if "Extract" in worked.question else worked.question)
        document = json.loads(worked.answer)
        assert list(document) == keys
        for value in document.values():
            assert str(value) in worked.question


def test_tool_conversations_call_a_declared_tool_then_use_its_result():
    names = {t["function"]["name"] for t in default_tools()}
    for conversation in data.training_conversations(4, 400, default_tools()):
        if conversation.kind not in data.TOOL_TASKS:
            continue
        call_message = conversation.messages[conversation.target_indices[0]]
        function = call_message["tool_calls"][0]["function"]
        declared = {t["function"]["name"] for t in conversation.tools}
        assert function["name"] == data.TOOL_TASKS[conversation.kind] and function["name"] in declared <= names
        result = json.loads(conversation.messages[-2]["content"])
        final = conversation.messages[-1]["content"]
        assert all(str(value) in final for key, value in result.items() if key in ("temperature_c", "result", "time"))
