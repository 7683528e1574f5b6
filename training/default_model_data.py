"""The seeded mixture of synthetic conversations the default model is trained and evaluated on.

`training_conversations(seed, count, tools)` and `heldout_conversations(seed, per_kind, tools,
exclude)` are pure functions of their arguments: the only randomness is a `random.Random` seeded
from them (string seeds hash with SHA-512, independent of PYTHONHASHSEED).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import default_model_arithmetic as arithmetic
import default_model_text as text
import default_model_tools as tooling
from default_model_arithmetic import Worked
from default_model_conversation import Conversation, answer, system, tool_call_message, tool_result, user

PLAIN_TASKS: dict[str, Callable[[random.Random], Worked]] = {
    "add": arithmetic.addition,
    "sub": arithmetic.subtraction,
    "mul": arithmetic.multiplication,
    "metric": arithmetic.metric_conversion,
    "clock": arithmetic.time_conversion,
    "copy": text.copy_task,
    "json": text.json_task,
    "chat": text.small_talk,
}
TOOL_TASKS = {"tool_weather": "get_weather", "tool_currency": "convert_currency", "tool_time": "lookup_time"}
REFUSAL_KIND = "tool_refusal"
# Relative share of each kind in the training mixture.
MIXTURE = {
    "add": 20, "sub": 20, "mul": 18, "metric": 4, "clock": 3, "copy": 8, "json": 5, "chat": 2,
    "tool_weather": 4, "tool_currency": 6, "tool_time": 4, REFUSAL_KIND: 2,
}
SYSTEM_PROMPTS = (
    "You are a helpful assistant.", "You are Helios, a small demo model.", "Answer briefly.",
    "You are a concise assistant.", "Think step by step and answer clearly.",
)
PREFIXES = ("Hi! ", "Hey, ", "Quick question: ", "Please help: ", "Hello. ", "Can you help? ")
SUFFIXES = (" Thanks!", " Thank you.", " Please.", " Thanks in advance.")
DECORATED_SHARE = 0.3
SYSTEM_SHARE = 0.2
PLAIN_WITH_TOOLS_SHARE = 0.05
HISTORY_SHARE = 0.08


def training_conversations(seed: int, count: int, tools: list[dict]) -> list[Conversation]:
    """`count` conversations drawn from `MIXTURE`."""
    rng = random.Random(f"helios-default-model-train-{seed}")
    kinds, weights = list(MIXTURE), list(MIXTURE.values())
    return [conversation(rng, rng.choices(kinds, weights)[0], tools) for _ in range(count)]


def heldout_conversations(seed: int, per_kind: int, tools: list[dict], exclude: set[str]) -> list[Conversation]:
    """`per_kind` conversations of every kind whose first user text is not in `exclude`."""
    rng = random.Random(f"helios-default-model-heldout-{seed}")
    chosen: list[Conversation] = []
    for kind in MIXTURE:
        found: list[Conversation] = []
        for _ in range(per_kind * 50):
            if len(found) == per_kind:
                break
            candidate = conversation(rng, kind, tools)
            if candidate.first_user_text not in exclude:
                found.append(candidate)
        chosen += found
    return chosen


def conversation(rng: random.Random, kind: str, tools: list[dict]) -> Conversation:
    if kind in PLAIN_TASKS:
        return _plain(rng, kind, tools)
    if kind == REFUSAL_KIND:
        return _refusal(rng, tools)
    return _tool_use(rng, kind, tools)


def _decorated(rng: random.Random, question: str, kind: str) -> str:
    """Sometimes a polite prefix, and (where it cannot change the task) a suffix; small talk stays
    as is (a greeting prefix would change the expected reply)."""
    if kind == "chat" or rng.random() >= DECORATED_SHARE:
        return question
    if kind == "copy" or rng.random() < 0.5:
        return rng.choice(PREFIXES) + question
    return question + rng.choice(SUFFIXES)


def _opening(rng: random.Random) -> list[dict]:
    return [system(rng.choice(SYSTEM_PROMPTS))] if rng.random() < SYSTEM_SHARE else []


def _plain(rng: random.Random, kind: str, tools: list[dict]) -> Conversation:
    worked = PLAIN_TASKS[kind](rng)
    declared = tooling.declared_tools(rng, tools, None) if rng.random() < PLAIN_WITH_TOOLS_SHARE else None
    messages = _opening(rng)
    if rng.random() < HISTORY_SHARE:
        earlier = PLAIN_TASKS[rng.choice(sorted(PLAIN_TASKS))](rng)
        messages += [user(earlier.question), answer(earlier.answer)]
    messages += [user(_decorated(rng, worked.question, kind)), answer(worked.answer, worked.reasoning)]
    return Conversation(kind, tuple(messages), declared, (len(messages) - 1,), worked.result)


def _tool_use(rng: random.Random, kind: str, tools: list[dict]) -> Conversation:
    exchange = tooling.EXCHANGES[TOOL_TASKS[kind]](rng)
    declared = tooling.declared_tools(rng, tools, exchange.tool)
    call_id = f"call_{rng.randrange(16**8):08x}"
    messages = _opening(rng) + [user(_decorated(rng, exchange.question, kind))]
    call_index = len(messages)
    messages += [
        tool_call_message(exchange.call, call_id),
        tool_result(call_id, exchange.result),
        answer(exchange.answer, exchange.reasoning),
    ]
    return Conversation(kind, tuple(messages), declared, (call_index, len(messages) - 1), exchange.answer)


def _refusal(rng: random.Random, tools: list[dict]) -> Conversation:
    missing = rng.choice(sorted(TOOL_TASKS.values()))
    exchange = tooling.EXCHANGES[missing](rng)
    declared = tooling.tools_without(rng, tools, missing)
    question = _decorated(rng, exchange.question, REFUSAL_KIND)
    messages = _opening(rng) + [user(question), answer(exchange.refusal, exchange.refusal_reasoning)]
    return Conversation(REFUSAL_KIND, tuple(messages), declared, (len(messages) - 1,), exchange.refusal)
