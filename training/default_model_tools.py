"""Tool-use conversations for the three declared tools, and their simulated results.

A tool conversation is: user question -> assistant tool call (no reasoning, so it renders the same
as a target and as history) -> tool result -> assistant answer (reasoning + a sentence that copies
the result's values). When the needed tool is not declared, the model answers that it cannot.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from default_model_conversation import ToolCall

WEATHER_CITIES = (
    "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw", "Oslo",
    "Stockholm", "Helsinki", "Copenhagen", "Dublin", "Amsterdam", "Brussels", "Zurich", "Athens",
    "Istanbul", "Cairo", "Nairobi", "Lagos", "Accra", "Cape Town", "Tokyo", "Osaka", "Seoul", "Beijing",
    "Shanghai", "Hong Kong", "Singapore", "Bangkok", "Jakarta", "Manila", "Hanoi", "Delhi", "Mumbai",
    "Dubai", "Tehran", "Moscow", "Kyiv", "Sydney", "Melbourne", "Auckland", "New York", "Boston",
    "Chicago", "Toronto", "Montreal", "Vancouver", "Seattle", "Denver", "Austin", "Miami",
    "Los Angeles", "San Francisco", "Mexico City", "Bogota", "Lima", "Santiago", "Buenos Aires",
    "Sao Paulo", "Rio de Janeiro", "Havana", "Reykjavik", "Edinburgh", "Munich", "Hamburg", "Lyon",
    "Geneva", "Krakow", "Budapest",
)
CONDITIONS = ("sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "clear", "stormy")
WEATHER_PHRASES = (
    "What's the weather in {c}?", "What is the weather like in {c} right now?", "Is it raining in {c}?",
    "How warm is it in {c}?", "Weather in {c}?", "Tell me the current weather in {c}.",
    "Do I need an umbrella in {c} today?", "How is the weather in {c}?", "Check the weather for {c}.",
)
CURRENCIES = {
    "USD": ("US dollars", "dollars"), "EUR": ("euros",), "GBP": ("British pounds", "pounds"), "JPY": ("yen",),
    "CHF": ("Swiss francs",), "CAD": ("Canadian dollars",), "AUD": ("Australian dollars",), "CNY": ("yuan",),
    "INR": ("rupees",),
}
USD_RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.88, "CAD": 1.36, "AUD": 1.52,
             "CNY": 7.2, "INR": 83.0}
CURRENCY_PHRASES = (
    "Convert {a} {f} to {t}.", "How much is {a} {f} in {t}?", "How many {t} do I get for {a} {f}?",
    "{a} {f} to {t}?", "Change {a} {f} into {t}.", "What is {a} {f} in {t}?",
)
TIMEZONES = {
    "Tokyo": "Asia/Tokyo", "Paris": "Europe/Paris", "London": "Europe/London", "New York": "America/New_York",
    "Los Angeles": "America/Los_Angeles", "Chicago": "America/Chicago", "Sydney": "Australia/Sydney",
    "Berlin": "Europe/Berlin", "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Moscow": "Europe/Moscow",
    "Dubai": "Asia/Dubai", "Mumbai": "Asia/Kolkata", "Singapore": "Asia/Singapore",
    "Hong Kong": "Asia/Hong_Kong", "Seoul": "Asia/Seoul", "Toronto": "America/Toronto",
    "Sao Paulo": "America/Sao_Paulo", "Mexico City": "America/Mexico_City", "Cairo": "Africa/Cairo",
    "Johannesburg": "Africa/Johannesburg", "Istanbul": "Europe/Istanbul", "Bangkok": "Asia/Bangkok",
    "Jakarta": "Asia/Jakarta",
}
TIME_CITY_PHRASES = (
    "What time is it in {p}?", "What's the local time in {p}?", "Current time in {p}?",
    "Tell me the time in {p}.", "What is the time in {p} right now?",
)
TIME_ZONE_PHRASES = ("What time is it in the {p} timezone?", "Tell me the time in {p}.", "Current time in {p}?")


@dataclass(frozen=True)
class ToolExchange:
    """A question, the call it needs, the simulated result and the final reasoning and answer."""

    tool: str
    question: str
    call: ToolCall
    result: str
    reasoning: str
    answer: str
    refusal_reasoning: str
    refusal: str


def _amount(rng: random.Random) -> int | float:
    if rng.random() < 0.7:
        return rng.randint(1, 5000)
    return round(rng.randint(100, 99999) / 100, 2)


def _number_text(value: int | float) -> str:
    return json.dumps(value)


def weather(rng: random.Random) -> ToolExchange:
    city = rng.choice(WEATHER_CITIES)
    temp, condition = rng.randint(-15, 40), rng.choice(CONDITIONS)
    result = json.dumps({"city": city, "temperature_c": temp, "condition": condition})
    return ToolExchange(
        "get_weather", rng.choice(WEATHER_PHRASES).format(c=city), ToolCall("get_weather", (("city", city),)),
        result, f"The tool says {city} is {temp} C and {condition}.",
        f"It is {temp} C and {condition} in {city} right now.",
        "The user asks about the weather, but no weather tool is available.",
        "I cannot check the weather because no weather tool is available.",
    )


def currency(rng: random.Random) -> ToolExchange:
    source, target = rng.sample(sorted(CURRENCIES), 2)
    amount = _amount(rng)
    words = rng.random() < 0.4
    spoken_from = rng.choice(CURRENCIES[source]) if words else source
    spoken_to = rng.choice(CURRENCIES[target]) if words else target
    question = rng.choice(CURRENCY_PHRASES).format(a=_number_text(amount), f=spoken_from, t=spoken_to)
    converted = round(amount / USD_RATES[source] * USD_RATES[target], 2)
    result = json.dumps({"amount": amount, "from": source, "to": target, "result": converted})
    call = ToolCall("convert_currency", (("amount", amount), ("from", source), ("to", target)))
    amount_text, converted_text = _number_text(amount), _number_text(converted)
    return ToolExchange(
        "convert_currency", question, call, result,
        f"The tool converted {amount_text} {source} to {converted_text} {target}.",
        f"{amount_text} {source} is about {converted_text} {target}.",
        "The user wants a currency conversion, but no currency tool is available.",
        "I cannot convert currencies because no currency tool is available.",
    )


def local_time(rng: random.Random) -> ToolExchange:
    if rng.random() < 0.75:
        place = rng.choice(sorted(TIMEZONES))
        zone, question = TIMEZONES[place], rng.choice(TIME_CITY_PHRASES).format(p=place)
    else:
        zone = rng.choice(sorted(TIMEZONES.values()) + ["UTC"])
        place, question = zone, rng.choice(TIME_ZONE_PHRASES).format(p=zone)
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    result = json.dumps({"timezone": zone, "time": clock})
    return ToolExchange(
        "lookup_time", question, ToolCall("lookup_time", (("timezone", zone),)), result,
        f"The tool says it is {clock} in {zone}.", f"It is {clock} in {place} right now.",
        "The user asks for the time, but no time tool is available.",
        "I cannot tell the time because no time tool is available.",
    )


EXCHANGES = {"get_weather": weather, "convert_currency": currency, "lookup_time": local_time}


def sorted_keys(value: Any) -> Any:
    """A copy of a JSON value with every mapping's keys sorted (what jinja2's own tojson emits)."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(item) for item in value]
    return value


def declared_tools(rng: random.Random, tools: list[dict], needed: str | None) -> tuple[dict, ...]:
    """A tool list as clients send it: usually all tools in order, sometimes shuffled or a subset
    containing `needed` (or, for a refusal, lacking it); keys sorted half the time."""
    roll = rng.random()
    if needed is not None and roll < 0.25:
        others = [t for t in tools if t["function"]["name"] != needed]
        chosen = [t for t in tools if t["function"]["name"] == needed] + rng.sample(others, rng.randint(0, 2))
        rng.shuffle(chosen)
    elif roll < 0.4:
        chosen = rng.sample(tools, len(tools))
    else:
        chosen = list(tools)
    if rng.random() < 0.5:
        chosen = [sorted_keys(tool) for tool in chosen]
    return tuple(chosen)


def tools_without(rng: random.Random, tools: list[dict], missing: str) -> tuple[dict, ...] | None:
    """A declared list lacking `missing` (possibly no tools at all), for refusal conversations."""
    others = [t for t in tools if t["function"]["name"] != missing]
    chosen = rng.sample(others, rng.randint(0, len(others)))
    if not chosen:
        return None
    if rng.random() < 0.5:
        chosen = [sorted_keys(tool) for tool in chosen]
    return tuple(chosen)
