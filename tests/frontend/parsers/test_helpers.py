"""Chunking independence of the text helpers (hypothesis), tag matching, and value typing."""

from __future__ import annotations

import io
import json
import re
import tokenize

import pytest
from hypothesis import given, settings, strategies as st

from helios.frontend.parsers.schema_refs import SchemaRefError
from helios.frontend.parsers.scan import MAX_CAPTURE_LEN, TagForm, TagMatch, TagSet, match_form
from helios.frontend.parsers.text import WrappedText, XmlEntityDecoder
from helios.frontend.parsers.values import (
    MAX_PYTHON_LITERAL_TOKENS, ToolRegistry, ValueKind, _num_tokens, json_value, schema_kinds, typed_value,
)

SMALL = settings(max_examples=150, deadline=None)
texts = st.text(alphabet="ab\n &;#x1ltgmpo<>", max_size=30)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


@SMALL
@given(texts, st.sampled_from(["", "\n", "\n\n", " \n"]), st.sampled_from(["", "\n", "\n\n"]), st.lists(st.integers(0, 40)),
       st.booleans())
def test_wrapped_text_is_chunking_independent(text, lead, tail, cuts, escaped):
    def run(pieces):
        wrapped = WrappedText(lead, tail, XmlEntityDecoder() if escaped else None)
        return "".join(wrapped.push(p) for p in pieces) + wrapped.close()

    whole = run([text])
    assert run(split(text, cuts)) == whole
    if not escaped:
        body = text[len(_common(text, lead)) :]
        cut = next(n for n in range(min(len(body), len(tail)), -1, -1) if n == 0 or tail.endswith(body[-n:]))
        assert whole == body[: len(body) - cut]


def _common(text: str, wrap: str) -> str:
    size = 0
    while size < min(len(text), len(wrap)) and text[size] == wrap[size]:
        size += 1
    return text[:size]


@SMALL
@given(texts, st.lists(st.integers(0, 40)))
def test_entity_decoding_is_chunking_independent(text, cuts):
    decoder = XmlEntityDecoder()
    chunked = "".join(decoder.decode(p) for p in split(text, cuts)) + decoder.finish()
    whole = XmlEntityDecoder()
    assert chunked == whole.decode(text) + whole.finish()


def test_entities():
    decoder = XmlEntityDecoder()
    assert decoder.decode("&lt;a&gt; &amp;amp; &#65;&#x42; &#0; &#xD800; &copy; &amp") == "<a> &amp; AB &#0; &#xD800; &copy; "
    assert decoder.finish() == "&amp"


def test_match_form_captures_partial_and_rejects():
    form = TagForm('<p name="', ('" s="', '">'))
    assert match_form('x<p name="k" s="true">', 1, form) == TagMatch("", 1, 22, ("k", "true"))
    for partial in ("<p na", '<p name="ke', '<p name="k" s', '<p name="k" s="t"'):
        assert match_form(partial, 0, form) == 1
    for bad in ('<p name="" s="t">', '<p name="a<b" s="t">', '<q>', '<p name="a\nb" s="t">'):
        assert match_form(bad, 0, form) == 0
    assert match_form('<p name="' + "k" * (MAX_CAPTURE_LEN + 2), 0, form) == 0


def test_tag_set_waits_only_for_undecided_starts():
    tags = TagSet({"open": TagForm("<tool>"), "sep": TagForm("\n")})
    assert tags.find("a < b <to", final=False) == (6, None)
    assert tags.find("a < b <to", final=True) == (9, None)
    assert tags.find("ab<tool>c", final=False) == (2, TagMatch("open", 2, 8, ()))
    assert tags.find("ab\n", final=False) == (2, TagMatch("sep", 2, 3, ()))


def test_schema_kinds():
    assert schema_kinds({"type": ["integer", "null"]}) == {ValueKind.INTEGER, ValueKind.NULL}
    assert schema_kinds({"enum": ["a", 1]}) == {ValueKind.STRING, ValueKind.INTEGER}
    assert schema_kinds({"oneOf": [{"type": "object"}, {"const": True}]}) == {ValueKind.OBJECT, ValueKind.BOOLEAN}
    assert schema_kinds({"description": "anything"}) == frozenset()
    registry = ToolRegistry.from_openai([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}}])
    assert registry.kinds("f", "n") == {ValueKind.INTEGER}
    assert registry.kinds("f", "other") == {ValueKind.STRING} == registry.kinds("g", "n")



def test_a_malformed_enum_constrains_nothing():
    """``"enum": 5`` in a tool's parameter schema raised TypeError out of `ToolRegistry.from_openai`
    (an HTTP 500 for a request with ``tool_choice: "auto"``, whose schema no grammar checks); a
    malformed ``anyOf`` was already ignored. Other non-list enums were read as lists of their
    characters or keys."""
    assert schema_kinds({"enum": 5}) == frozenset() == schema_kinds({"enum": {"a": 1}})
    assert schema_kinds({"type": "integer", "enum": None}) == {ValueKind.INTEGER}
    assert schema_kinds({"type": "integer", "enum": "ab"}) == {ValueKind.INTEGER}
    registry = ToolRegistry.from_openai([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"enum": 5}, "m": {"type": "integer", "enum": True}}}}}])
    assert registry.kinds("f", "n") == {ValueKind.STRING} and registry.kinds("f", "m") == {ValueKind.INTEGER}


@pytest.mark.parametrize("named", ["#/nothing", {"type": "string"}])
def test_a_ref_to_a_properties_map_with_a_parameter_named_ref_is_no_crash(named):
    """A ref to a ``properties`` map (or a data keyword's value) read the map's "$ref" key, which
    names a parameter there, as a ref: KeyError or TypeError (unhashable) out of checking the
    document, an HTTP 500 for the request. It is no ref: a 400 where it does not resolve, or served."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/properties"}, "$ref": named}}
    for document in (schema, {"type": "object", "properties": {"a": {"$ref": "#/default"}},
                              "default": {"$ref": named}}):
        tool = {"type": "function", "function": {"name": "f", "parameters": document}}
        if isinstance(named, str):
            with pytest.raises(SchemaRefError, match="#/nothing' does not resolve"):
                ToolRegistry.from_openai([tool])
        else:
            assert ToolRegistry.from_openai([tool]).kinds("f", "a") == {ValueKind.STRING}

def test_typed_values():
    kinds = ValueKind.INTEGER, ValueKind.NUMBER, ValueKind.BOOLEAN, ValueKind.NULL, ValueKind.OBJECT, ValueKind.ARRAY, ValueKind.STRING
    I, N, B, Z, O, A, S = (frozenset({kind}) for kind in kinds)
    assert typed_value(" 42\n", I) == ("42", True)
    assert typed_value("4.5", I) == ('"4.5"', False)
    assert typed_value("4.0", I | N) == ("4.0", True)
    assert typed_value("NaN", N) == ('"NaN"', False)
    assert typed_value("FALSE", B) == ("false", True)
    assert typed_value("null", Z | I) == ("null", True)
    assert typed_value('{"a": [1]}', O) == ('{"a": [1]}', True)
    assert typed_value("[1]", O) == ('"[1]"', False)
    assert typed_value("x", A | S) == ('"x"', True)
    assert typed_value(" raw \n", S) == ('" raw \\n"', True)
    assert typed_value("ünï", frozenset()) == ('"ünï"', True)
    assert json_value(" [1, 2] ") == ("[1, 2]", True)
    assert json_value("Infinity") == ('"Infinity"', False)
    assert json_value("[1e999]") == ('"[1e999]"', False) and typed_value("1e999", N) == ('"1e999"', False)
    assert re.fullmatch(r'"9+"', typed_value("9" * 5000, I).json_text)


def test_an_integer_written_as_a_whole_number_is_that_integer():
    """JSON Schema's integers are the numbers with a zero fractional part, and transformers' response
    parser reads "3.0" for an integer parameter as 3; it came back as the string "3.0" with
    INVALID_VALUE. A parameter that also allows numbers keeps the number as written."""
    I, N, S = (frozenset({kind}) for kind in (ValueKind.INTEGER, ValueKind.NUMBER, ValueKind.STRING))
    assert typed_value(" 4.0\n", I) == ("4", True) and typed_value("1e3", I) == ("1000", True)
    assert typed_value("4.0", I | S) == ("4", True) and typed_value("4.5", I | S) == ('"4.5"', True)
    assert typed_value("4.0", I | N) == ("4.0", True)
    assert typed_value("1e999", I) == ('"1e999"', False) and typed_value("true", I) == ('"true"', False)


def test_a_python_literal_object_or_array_is_that_json_value():
    """Models trained on Python write ``{'a': True, 'b': None}`` for an object parameter; vLLM's
    Qwen3-Coder and GLM parsers read it with ``ast.literal_eval``, where it came back as the string
    with INVALID_VALUE. Nothing but literals of JSON values is read: no code, no sets, bytes, complex
    numbers, non-string keys, infinities or texts beyond the bound."""
    O, A, S = (frozenset({kind}) for kind in (ValueKind.OBJECT, ValueKind.ARRAY, ValueKind.STRING))
    assert typed_value("{'a': True, 'b': None, 'c': [1, 2.5, 'x']}\n", O) == \
        ('{"a": true, "b": null, "c": [1, 2.5, "x"]}', True)
    assert typed_value("[('x', False)]", A) == ('[["x", false]]', True)
    assert typed_value("{'a': 1}", A | S) == ('"{\'a\': 1}"', True)  # no array: the string as written
    for text in ("{1: 2}", "{1, 2}", "[b'x']", "[1+2j]", "[1e999]", "[__import__('os')]", "[x]", "(1, 2)",
                 "[" * 10000, "[" + "9" * 5000 + "]", "['" + "a" * 70000 + "']"):
        assert typed_value(text, O | A) == (json.dumps(text), False), text[:20]


def test_a_python_literal_of_more_tokens_than_the_bound_is_not_read():
    """A 64 KiB literal such as ``[1,1,...]`` (32k elements) held the GIL for about 0.2 s in
    ``ast.literal_eval``, whose cost follows its tokens, not its length: every other request stalled.
    Literals beyond `MAX_PYTHON_LITERAL_TOKENS` tokens are not read now, however they are spelled;
    a string's length costs nothing (one token)."""
    A = frozenset({ValueKind.ARRAY})
    within = "[" + ",".join(["None"] * (MAX_PYTHON_LITERAL_TOKENS // 2 - 1)) + "]"  # no JSON: Python's
    assert typed_value(within, A) == (within.replace("None", "null").replace(",", ", "), True)
    assert typed_value("['" + "a, " * 20000 + "']", A).valid
    n = MAX_PYTHON_LITERAL_TOKENS
    for text in ("[" + "None," * n + "]", "[" + "()," * n + "]", "[" + "-" * 2 * n + "1]",
                 "[" + "1.5e-3, " * n + "None]", "[" + "1or " * n + "1]", "['''x' ''', " + "1, " * n + "'y']",
                 "[1, #'''\n" + "1, " * n + "\n#'''\n]"):
        assert _num_tokens(text, n) > n, text[:20]
        assert typed_value(text, A) == (json.dumps(text), False), text[:20]


def _python_tokens(text: str) -> int:
    """The tokens Python's tokenizer reads in ``text`` before its first error (or its end)."""
    count = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.ERRORTOKEN and token.string.strip():
                break
            count += token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.ERRORTOKEN,
                                        tokenize.INDENT, tokenize.DEDENT)
    except (tokenize.TokenError, SyntaxError):
        pass
    return count


PYTHON_PIECES = ["'", '"', "'''", '"""', "\\", "\\'", "\n", "#", "r", "b", "rb", "f", "x", "1", "1e", "1.5e-3",
                 "0x1f", "j", "_", "or", "-", ".", ",", "[", "]", "{", ":", " ", "é", "None"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(PYTHON_PIECES), max_size=25))
def test_the_python_literal_token_count_never_undercounts_pythons_tokenizer(pieces):
    """The bound above holds only if the cheap count never reads fewer tokens than Python does
    (triple-quoted strings, comments holding quotes, string prefixes, numbers run into names)."""
    text = "[" + "".join(pieces)
    try:
        counted = _num_tokens(text, 10**9)
    except ValueError:  # an f-string: refused
        assert "f" in pieces
        return
    assert counted >= _python_tokens(text), text
