"""Filters and methods that grow their input by a fixed factor, and lists of a string's characters, in
the bounded sandbox: one call built its whole value (``urlencode`` twelve characters for an emoji,
``escape`` five for a quote, ``tojson`` six for a control character, a format one copy of its argument
per field, ``list``/``batch``/``slice``/``sort`` a string object per character), far past the size cap,
since a single call counts a single step. Each is now refused before it is built; within the cap
each renders as jinja's own sandbox has it."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from helios.core.template_sandbox import BoundedSandbox, RenderBounds, RenderLimitExceeded, render_bounded

BOUNDS = RenderBounds(max_chars=1 << 20, cpu_seconds=2.0)
VALUES = {"emoji": "😀", "quote": '"', "control": "\x01", "x": "x", "iota": "ΐ"}  # 'ΐ'.upper() is 3 characters


def render(source: str) -> str:
    return render_bounded(BoundedSandbox().from_string(source), VALUES, BOUNDS)


@pytest.mark.parametrize("source, what, max_bytes", [
    ("{{ (emoji * 2**20)|urlencode|length }}", "URL-quoted", 4),  # 12 Mi characters (counting encodes the 4 MB)
    ("{{ {'k': emoji * 2**18}|urlencode|length }}", "URL-quoted", 3),
    ("{{ (quote * 2**20)|escape|length }}", "escaped", 3),  # 5 Mi
    ("{{ (quote * 2**20)|e|length }}", "escaped", 3),
    ("{{ (quote * 2**20)|forceescape|length }}", "escaped", 3),
    ("{{ {'a': quote * 2**18}|xmlattr|length }}", "attribute", 3),
    ("{{ (control * 2**20)|tojson|length }}", "JSON", 3),  # 6 Mi
    ("{{ [control * 2**17, control * 2**17]|tojson|length }}", "JSON", 3),
    ("{{ (emoji * 2**20)|tojson(ensure_ascii=True)|length }}", "JSON", 4),  # 12 Mi
    ("{{ '%s%s%s%s%s'|format(x * 2**20, x * 2**20, x * 2**20, x * 2**20, x * 2**20)|length }}", "formatted", 3),
    ("{{ '%(a)s%(a)s%(a)s%(a)s%(a)s'|format(a=x * 2**20)|length }}", "formatted", 3),
    ("{{ '{0}{0}{0}{0}{0}'.format(x * 2**20)|length }}", "formatted", 3),
    ("{{ '{a}{a}{a}{a}{a}'.format_map({'a': x * 2**18})|length }}", "formatted", 3),
    ("{{ ('%(a)s%(a)s%(a)s%(a)s%(a)s' % {'a': x * 2**18})|length }}", "formatted", 3),
    ("{{ (iota * 2**19)|upper|length }}", "case mapping", 4),
    ("{{ (iota * 2**19).upper()|length }}", "case mapping", 4),
    ("{{ (emoji * 2**20)|list|length }}", "list of characters", 6),  # 1 Mi strings of 80 bytes
    ("{{ (emoji * 2**20)|batch(1)|list|length }}", "list of characters", 6),
    ("{{ (emoji * 2**20)|slice(2)|first|length }}", "list of characters", 6),
    ("{{ (emoji * 2**20)|sort|length }}", "list of characters", 6),
    ("{{ (x * 2**17)|map('center', 20)|list|length }}", "a list", 3),  # weighed as it comes
])
def test_growth_past_the_cap_is_refused_before_it_is_built(source, what, max_bytes):
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match=what):
            render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the input (up to 4 bytes a character) and what counting it takes; the output was 5 to 90 times that
    assert peak < max_bytes * 4 * BOUNDS.max_chars, peak


@pytest.mark.parametrize("source", [
    "{{ ('😀 a/b?' * 1000)|urlencode }}", "{{ {'k': '😀 &=', 'n': 1}|urlencode }}", "{{ ('<a href=\"x\">\\'&' * 1000)|e }}",
    "{{ {'a': '<\"' * 100, 'b': none}|xmlattr }}",
    "{{ '%s|%s'|format('a' * 1000, 'b') }}", "{{ '{0}{0}'.format('a' * 1000) }}", "{{ '%(a)s%(a)s' % {'a': 'x'} }}",
    "{{ ('ΐß' * 1000)|upper }}", "{{ ('ΐß' * 1000).title() }}", "{{ ('abc' * 1000)|list|join('-') }}",
    "{{ ('abcdefg' * 100)|batch(3, 'z')|list }}", "{{ ('abcdefg' * 100)|slice(3, 'z')|list }}",
    "{{ ('cab' * 100)|sort|join }}", "{{ ('abc' * 100)|map('upper')|list }}", "{{ range(5)|list }}",
    "{{ {'a': 1}|list }}", "{{ (1, 2)|list }}",
])
def test_within_the_cap_renders_as_jinja_has_it(source):
    expected = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source).render()
    assert render(source) == expected


@pytest.mark.parametrize("ensure_ascii, indent", [(False, None), (True, None), (False, 2), (True, "\t")])
def test_json_within_the_cap_prints_as_json_dumps(ensure_ascii, indent):
    """``tojson`` is transformers' (``json.dumps``, not jinja's HTML-safe one), escapes counted or not."""
    value = {"k\x03": ["\x01\n\"😀é" * 1000, {"n": [1, 2.5, None, True]}], "s": "<&>" * 10}
    source = "{{ value|tojson(ensure_ascii=ensure_ascii, indent=indent) }}"
    rendered = render_bounded(BoundedSandbox().from_string(source),
                              {"value": value, "ensure_ascii": ensure_ascii, "indent": indent}, BOUNDS)
    assert rendered == json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)
