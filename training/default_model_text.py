"""Text tasks: exact copies, JSON objects extracted from a sentence, and fixed small talk.

Each generator takes a `random.Random` and returns a `Worked` (question, reasoning, answer,
result) like the arithmetic generators; `result` is what a checker compares the answer with.
"""

from __future__ import annotations

import json
import random

from default_model_arithmetic import Worked

WORDS = tuple(
    """the a an and or but of to in on at for with from by about over under after before is are was
    were be been have has had do does did will can could would should may might must not no yes this
    that these those it its they them their we our you your he she his her my me i time day week year
    today tomorrow morning evening night people person man woman child friend family team group city
    country world house home room door window table chair book page letter note message email report
    plan idea question answer problem reason result number list name word line story news music song
    film game water food bread coffee tea milk apple orange river sea mountain road car train bus ship
    plane bike street park garden tree flower bird dog cat fish horse red blue green yellow black white
    big small long short new old good bad first last next early late fast slow happy quiet warm cold
    open close start stop make take give keep find send read write call meet help move play run walk
    talk listen watch learn teach buy sell pay build clean check draft save share update review""".split()
)
NAMES = (
    "Alice", "Bob", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam",
    "Maria", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wen", "Xavier",
    "Yara", "Zoe", "Anna", "Ben", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Julia",
    "Kofi", "Lena", "Mateo", "Nina", "Oscar", "Priya", "Ravi", "Sofia", "Tom", "Uma", "Viktor", "Yusuf",
)
JOBS = (
    "teacher", "doctor", "nurse", "engineer", "farmer", "baker", "pilot", "lawyer", "writer", "painter",
    "chef", "driver", "student", "designer", "plumber", "dentist", "cashier", "editor", "gardener",
    "librarian", "musician", "scientist", "tailor", "waiter",
)
TOWNS = (
    "Oslo", "Lima", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Dublin", "Lisbon", "Athens",
    "Cairo", "Nairobi", "Accra", "Tokyo", "Seoul", "Delhi", "Dhaka", "Hanoi", "Manila", "Sydney", "Quito",
    "Bogota", "Denver", "Austin", "Boston", "Toronto", "Chicago", "Munich", "Zurich", "Geneva", "Krakow",
)
COPY_PHRASES = (
    "Repeat exactly: {t}", "Repeat this text exactly: {t}", "Copy the following text: {t}",
    "Say exactly this: {t}", "Echo: {t}", "Repeat after me: {t}", "Please repeat exactly: {t}",
)
COPY_REASONING = (
    "Repeat the text exactly.", "Copy the text word for word.", "The user wants the text repeated exactly.",
)


def _code(rng: random.Random) -> str:
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz0123456789"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8)))


def copy_text(rng: random.Random) -> str:
    """A random sentence of 2..16 words; some words are names, numbers or random codes."""
    words = []
    for _ in range(rng.randint(2, 16)):
        roll = rng.random()
        if roll < 0.08:
            words.append(rng.choice(NAMES))
        elif roll < 0.14:
            words.append(str(rng.randint(0, 9999)))
        elif roll < 0.18:
            words.append(_code(rng))
        else:
            words.append(rng.choice(WORDS))
    if rng.random() < 0.6:
        words[0] = words[0][:1].upper() + words[0][1:]
    text = " ".join(words)
    if rng.random() < 0.5:
        text += rng.choice(".!?,;:")
    return text


def copy_task(rng: random.Random) -> Worked:
    text = copy_text(rng)
    return Worked(rng.choice(COPY_PHRASES).format(t=text), rng.choice(COPY_REASONING), text, text)


PERSON_SENTENCES = (
    "{name} is {age} years old, works as a {job} and lives in {city}.",
    "{name} lives in {city}, is {age}, and works as a {job}.",
    "Meet {name}, a {age}-year-old {job} from {city}.",
    "{name} ({age}) is a {job} in {city}.",
    "In {city} lives {name}, a {job} aged {age}.",
)
JSON_PHRASES = (
    "Reply with a JSON object with the keys {keys}. {s}",
    "Extract {keys} as a JSON object: {s}",
    "{s} Answer as JSON with keys {keys}.",
    "Return JSON with keys {keys} for this text: {s}",
)


def json_task(rng: random.Random) -> Worked:
    """Pull 1..4 requested fields out of a sentence about a person, in the requested key order."""
    person = {
        "name": rng.choice(NAMES), "age": rng.randint(18, 90), "job": rng.choice(JOBS), "city": rng.choice(TOWNS),
    }
    keys = rng.sample(list(person), rng.randint(1, 4))
    quoted = [f'"{key}"' for key in keys]
    key_text = quoted[0] if len(keys) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
    sentence = rng.choice(PERSON_SENTENCES).format(**person)
    question = rng.choice(JSON_PHRASES).format(keys=key_text, s=sentence)
    reasoning = "\n".join(f"{key}: {person[key]}" for key in keys)
    document = json.dumps({key: person[key] for key in keys})
    return Worked(question, reasoning, document, document)


SMALL_TALK = (
    (("Hi", "Hello", "Hello!", "Hi there", "Hey", "Good morning"), "The user greets me.",
     "Hello! I am the small Helios demo model. Ask me some arithmetic, a unit conversion, or to repeat a text."),
    (("Who are you?", "What are you?", "What is your name?", "Introduce yourself."), "The user asks who I am.",
     "I am the small built-in demo model of Helios. I can do arithmetic, convert units, call tools, repeat text "
     "and answer in JSON."),
    (("What can you do?", "Help", "How can you help me?", "What are you good at?"), "The user asks what I can do.",
     "I can add, subtract and multiply numbers, convert km, kg and hours, call the weather, currency and time "
     "tools, repeat text exactly and answer in JSON."),
    (("Thanks", "Thank you!", "Thanks a lot", "Great, thanks."), "The user thanks me.", "You are welcome!"),
    (("Bye", "Goodbye", "See you"), "The user says goodbye.", "Goodbye!"),
)


def small_talk(rng: random.Random) -> Worked:
    prompts, reasoning, reply = rng.choice(SMALL_TALK)
    return Worked(rng.choice(prompts), reasoning, reply, reply)
