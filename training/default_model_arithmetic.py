"""Arithmetic and unit-conversion questions with short place-by-place reasoning.

Every generator takes a `random.Random` (the only source of randomness, so a seed fixes the output)
and returns a `Worked` (question, reasoning, answer, exact result as text). The reasoning first
restates the operands zero-padded to a fixed width, so every digit's place is visible from the
left (a causal model cannot see how long a number is until it ends), then spells out one line per
place, lowest first; a small model then needs only digit facts and copying. The answer restates
the result in a fixed sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

PLACES = ("ones", "tens", "hundreds", "thousands")
WIDTH = 3  # operands of addition and subtraction are restated zero-padded to this many digits


@dataclass(frozen=True)
class Worked:
    """A worked question: the user's text, the reasoning, the final answer and the bare result."""

    question: str
    reasoning: str
    answer: str
    result: str


ADD_PHRASES = (
    "What is {a} + {b}?", "What is {a}+{b}?", "Compute {a} + {b}.", "Calculate {a} plus {b}.",
    "{a} + {b} = ?", "Add {a} and {b}.", "What is the sum of {a} and {b}?", "How much is {a} plus {b}?",
    "{a}+{b}", "Please add {a} and {b}.", "what's {a} plus {b}?",
)
SUB_PHRASES = (
    "What is {a} - {b}?", "What is {a}-{b}?", "Compute {a} - {b}.", "Calculate {a} minus {b}.",
    "{a} - {b} = ?", "Subtract {b} from {a}.", "What is {a} minus {b}?", "How much is {a} minus {b}?",
    "{a}-{b}", "what's {a} minus {b}?",
)
MUL_PHRASES = (
    "What is {a} * {b}?", "What is {a} x {b}?", "What is {a} times {b}?", "Compute {a} * {b}.",
    "Multiply {a} by {b}.", "What is the product of {a} and {b}?", "{a} * {b} = ?", "{a}*{b}",
    "Calculate {a} times {b}.", "what's {a} times {b}?",
)


def _operand(rng: random.Random) -> int:
    """A number of 1 to 3 digits, longer numbers more often."""
    digits = rng.choices((1, 2, 3), weights=(15, 30, 55))[0]
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def _digit(number: int, place: int) -> int:
    return number // 10**place % 10


def addition_lines(a: int, b: int) -> list[str]:
    """One line per place of the zero-padded operands: `tens: 4+8+1=13, write 3, carry 1`."""
    lines, carry = [], 0
    for place in range(WIDTH):
        x, y = _digit(a, place), _digit(b, place)
        total = x + y + carry
        expr = f"{x}+{y}" + ("+1" if carry else "")
        line = f"{PLACES[place]}: {expr}={total}, write {total % 10}"
        carry = total // 10
        lines.append(line + (", carry 1" if carry else ""))
    if carry:
        lines.append(f"{PLACES[WIDTH]}: carry 1, write 1")
    return lines


def subtraction_lines(a: int, b: int) -> list[str]:
    """For a >= b, one line per place: `tens: 1-4-1=-4, -4+10=6, write 6, borrow 1`."""
    lines, borrow = [], 0
    for place in range(WIDTH):
        x, y = _digit(a, place), _digit(b, place)
        value = x - y - borrow
        expr = f"{x}-{y}" + ("-1" if borrow else "")
        if value < 0:
            lines.append(f"{PLACES[place]}: {expr}={value}, {value}+10={value + 10}, write {value + 10}, borrow 1")
            borrow = 1
        else:
            lines.append(f"{PLACES[place]}: {expr}={value}, write {value}")
            borrow = 0
    return lines


def multiplication_lines(a: int, b: int) -> list[str]:
    """For `a` < 100 and a one-digit `b`: the ones line, then the tens line adding the carry."""
    ones, tens = _digit(a, 0) * b, _digit(a, 1) * b
    first = f"ones: {_digit(a, 0)}*{b}={ones}, write {ones % 10}"
    if ones < 10:
        return [first, f"tens: {_digit(a, 1)}*{b}={tens}, write {tens}"]
    carry = ones // 10
    return [f"{first}, carry {carry}", f"tens: {_digit(a, 1)}*{b}={tens}, {tens}+{carry}={tens + carry}, write {tens + carry}"]


def addition(rng: random.Random) -> Worked:
    a, b = _operand(rng), _operand(rng)
    question = rng.choice(ADD_PHRASES).format(a=a, b=b)
    lines = [f"{a:03d}+{b:03d}", *addition_lines(a, b), f"answer: {a + b}"]
    return Worked(question, "\n".join(lines), f"{a} + {b} = {a + b}.", str(a + b))


def subtraction(rng: random.Random) -> Worked:
    a, b = _operand(rng), _operand(rng)
    if a < b and rng.random() < 0.6:
        a, b = b, a
    question = rng.choice(SUB_PHRASES).format(a=a, b=b)
    if a >= b:
        lines = [f"{a:03d}-{b:03d}", f"{a:03d}>={b:03d}, so compute {a:03d}-{b:03d}", *subtraction_lines(a, b)]
    else:
        lines = [f"{a:03d}-{b:03d}", f"{a:03d}<{b:03d}, so compute {b:03d}-{a:03d} and negate", *subtraction_lines(b, a)]
    lines.append(f"answer: {a - b}")
    return Worked(question, "\n".join(lines), f"{a} - {b} = {a - b}.", str(a - b))


def multiplication(rng: random.Random) -> Worked:
    a = rng.randint(2, 9) if rng.random() < 0.15 else rng.randint(10, 99)
    b = rng.randint(2, 9)
    left, right = (b, a) if rng.random() < 0.25 else (a, b)
    question = rng.choice(MUL_PHRASES).format(a=left, b=right)
    lines = [f"{a:02d}*{b}", *multiplication_lines(a, b), f"answer: {a * b}"]
    return Worked(question, "\n".join(lines), f"{left} * {right} = {a * b}.", str(a * b))


def _decimal_text(value: Decimal) -> str:
    """Plain decimal notation without trailing zeros: 3.50 -> 3.5, 12.0 -> 12."""
    return format(value.normalize(), "f")


def _metric_value(rng: random.Random) -> Decimal:
    kind = rng.random()
    if kind < 0.6:
        return Decimal(rng.randint(1, 99))
    if kind < 0.9:
        return Decimal(rng.randint(1, 209)) / 10
    return Decimal(rng.randint(1, 999)) / 100


METRIC_UNITS = (
    # (big unit, small unit, big word, small word)
    ("km", "m", "kilometers", "meters"),
    ("kg", "g", "kilograms", "grams"),
)
TO_SMALL_PHRASES = (
    "Convert {v} {big} to {small_word}.", "How many {small_word} are in {v} {big}?", "{v} {big} in {small_word}?",
    "What is {v} {big_word} in {small_word}?", "Convert {v} {big_word} to {small}.",
)
TO_BIG_PHRASES = (
    "Convert {v} {small} to {big_word}.", "How many {big_word} are in {v} {small}?", "{v} {small} in {big_word}?",
    "What is {v} {small_word} in {big_word}?", "Convert {v} {small_word} to {big}.",
)


def metric_conversion(rng: random.Random) -> Worked:
    """km <-> m or kg <-> g, factor 1000."""
    big, small, big_word, small_word = rng.choice(METRIC_UNITS)
    value = _metric_value(rng)
    big_text, small_text = _decimal_text(value), _decimal_text(value * 1000)
    names = {"big": big, "small": small, "big_word": big_word, "small_word": small_word}
    if rng.random() < 0.5:
        question = rng.choice(TO_SMALL_PHRASES).format(v=big_text, **names)
        reasoning = f"1 {big} = 1000 {small}\n{big_text}*1000={small_text}"
        return Worked(question, reasoning, f"{big_text} {big} = {small_text} {small}.", small_text)
    question = rng.choice(TO_BIG_PHRASES).format(v=small_text, **names)
    reasoning = f"1000 {small} = 1 {big}\n{small_text}/1000={big_text}"
    return Worked(question, reasoning, f"{small_text} {small} = {big_text} {big}.", big_text)


TO_MINUTES_PHRASES = (
    "How many minutes are in {h} {hw}?", "Convert {h} {hw} to minutes.", "{h} {hw} in minutes?",
    "How many minutes is {h} h?", "What is {h} {hw} in minutes?",
)
TO_HOURS_PHRASES = (
    "How many hours are in {m} minutes?", "Convert {m} minutes to hours.", "{m} minutes in hours?",
    "How many hours is {m} min?", "What is {m} minutes in hours?",
)


def time_conversion(rng: random.Random) -> Worked:
    """hours <-> minutes for whole hours 1..24, via the six times table."""
    hours = rng.randint(1, 24)
    minutes = hours * 60
    if rng.random() < 0.5:
        question = rng.choice(TO_MINUTES_PHRASES).format(h=hours, hw=_hours_word(hours))
        reasoning = f"1 hour = 60 minutes\n{hours}*6={hours * 6}, so {hours}*60={minutes}"
        return Worked(question, reasoning, f"{hours} {_hours_word(hours)} = {minutes} minutes.", str(minutes))
    question = rng.choice(TO_HOURS_PHRASES).format(m=minutes)
    reasoning = f"60 minutes = 1 hour\n{minutes}/60={hours * 6}/6={hours}"
    return Worked(question, reasoning, f"{minutes} minutes = {hours} {_hours_word(hours)}.", str(hours))


def _hours_word(hours: int) -> str:
    return "hour" if hours == 1 else "hours"
