"""Hostile client schemas on the structured-output and tool-call grammar path: each either compiles
to a grammar that holds the value to its syntax, or is refused before admission with a typed 400
(`GrammarError`, `SchemaRefError`, ...) naming the request field at fault; never an internal error,
a fetch, a hang or a memory blow-up. Memory is bounded by tracemalloc peaks, never by time."""

from __future__ import annotations

import json

import pytest

from helios.frontend.parsers.schema_refs import SchemaRefError
from helios.frontend.structured.grammar import GrammarError, GrammarKind, GrammarRequest, shape_error
from helios.frontend.structured.grammar_lark import not_containing
from helios.frontend.parsers.calls import ValueFormat
from helios.frontend.structured.grammar_values import ValueStyle, safe_schema, string_pattern

from .served import ids_of
from .test_grammar_tools import accepts, chat, plain_ids, served, tool  # noqa: F401

# -- JSON values keep the value closer out of their own string constraints ------------------------

PATTERNED = {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "string", "pattern": "^.*$"}},
    "o": {"type": "object", "properties": {"s": {"type": "string", "format": "no-such-format"},
                                           "t": {"type": ["string", "null"], "pattern": "^x"}}},
}}


def test_a_json_string_pattern_is_intersected_with_the_value_closer_rule(served):
    """A string's own ``pattern`` (or ``format``, which llguidance may ignore) replaced the rule that
    keeps the value closer out of JSON strings: ``".*"`` let a Qwen value write ``</parameter>``
    inside a string and end the parameter early."""
    case = served["qwen"]
    prepared = case.model.prepare_chat(chat(case, tools=[tool(PATTERNED)], tool_choice="required"))
    head = ids_of(case.tokenizer, "</think>", "<tool_call>", "\n<function=f>\n<parameter=a>\n")
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["x </p> y"]\n</parameter>\n'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["x</parameter>'))
    head = ids_of(case.tokenizer, "</think>", "<tool_call>", "\n<function=f>\n<parameter=o>\n")
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"s": "a", "t": "xy"}\n</parameter>\n'))
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": null}\n</parameter>\n'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"s": "a</parameter>'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": "x</parameter>'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '{"t": "y'))  # the pattern still holds


def test_escaped_json_strings_keep_entities_under_their_own_pattern(served):
    case = served["xtml"]
    prepared = case.model.prepare_chat(chat(case, tools=[tool(PATTERNED)], tool_choice="required"))
    head = ids_of(case.tokenizer, '<xtml:calls>\n<xtml:call name="f">\n<xtml:arg name="a">')
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["a &lt; b"]'))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, '["a <'))


def test_large_string_enums_in_json_values_still_compile(served):
    """String enum values are filtered against the closer rule, not intersected with it one by one
    (which made a DSML call grammar of 2 x 2500 enum values too big to compile)."""
    case = served["dsml"]
    schema = {"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(2500)]},
                                               "b": {"type": "array", "items": {"enum": [f"w{i}" for i in range(2500)]}}}}
    assert case.model.prepare_chat(chat(case, tools=[tool(schema)], tool_choice="required")).grammar is not None


def test_safe_schema_adds_the_closer_rule_beside_string_constraints():
    pattern = f"^{not_containing('</v>')}$"
    safe = safe_schema({"type": "string", "pattern": "^a", "allOf": [{"type": "string", "maxLength": 9}]}, pattern)
    assert safe["pattern"] == "^a"
    assert safe["allOf"] == [{"type": "string", "maxLength": 9, "pattern": pattern}, {"pattern": pattern}]
    assert safe_schema({"enum": ["a", "b</v>", 1, "</v"]}, pattern) == {"enum": ["a", 1, "</v"]}
    assert safe_schema({"const": "x</v>y"}, pattern) == {"enum": []}
    assert safe_schema({"const": "x</y"}, pattern) == {"const": "x</y"}
    escaped = string_pattern(ValueStyle(ValueFormat.XML_ESCAPED), "</v>")
    # escaped syntaxes write each value escaped, as the parser decodes it back (test_tool_value_grammars)
    assert safe_schema({"enum": ["a &lt; b", "a < b", "&quot;"]}, escaped) == {"enum": ["a &amp;lt; b", "a &lt; b",
                                                                                  "&amp;quot;"]}
    assert safe_schema({"type": "string"}, pattern) == {"type": "string", "pattern": pattern}


# -- $refs: only local ones, never fetched; errors name the field -------------------------------------

REMOTE_REFS = ["http://127.0.0.1:9/schema.json", "https://example.com/s#/a", "file:///etc/passwd",
               "other.json#/a", "//host/x", "urn:x:y"]


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test if anything opens a socket or a URL."""
    import socket
    import urllib.request

    def refuse(*args, **kwargs):
        raise AssertionError(f"a schema $ref was fetched: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.mark.parametrize("ref", REMOTE_REFS)
def test_remote_and_file_refs_are_400s_naming_the_field_and_never_fetched(served, no_network, ref):
    """A bad $ref was a 400 without ``param`` (the error body's param was null)."""
    case = served["qwen"]
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(SchemaRefError, match="is not local") as caught:
        case.model.prepare_chat(chat(case, response_format=rf))
    assert (caught.value.http_status, caught.value.param) == (400, "response_format")
    for fields in ({"tool_choice": "required"}, {}):
        with pytest.raises(SchemaRefError, match="tool 'f' parameters: .*is not local") as caught:
            case.model.prepare_chat(chat(case, tools=[tool(schema)], **fields))
        assert (caught.value.http_status, caught.value.param) == (400, "tools[0].function.parameters")


def test_ref_cycles_and_dangling_refs_name_the_field(served):
    case = served["qwen"]
    cycle = {"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}
    dangling = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    for schema, reason in ((cycle, "refers to itself"), (dangling, "does not resolve")):
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        with pytest.raises(SchemaRefError, match=reason) as caught:
            case.model.prepare_chat(chat(case, response_format=rf))
        assert caught.value.param == "response_format"
    recursive = {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {"n": {"$ref": "#/$defs/A"}}}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": recursive}}
    assert case.model.prepare_chat(chat(case, response_format=rf)).grammar is not None  # recursion stays a ref


# -- shapes llguidance compiles in unbounded time are refused before it sees them ----------------------


def pattern_properties(n: int) -> dict:
    return {"type": "object", "patternProperties": {f"^p{i}$": {"type": "integer"} for i in range(n)}}


def joint_patterns(n: int) -> dict:
    """A string under ``n`` patterns together: its own, an allOf branch's, and one behind a $ref."""
    return {"$defs": {"tail": {"pattern": "^[a-z]{1,}$"}}, "type": "object", "properties": {"s": {
        "type": "string", "pattern": "^[a-z]{2,}$",
        "allOf": [{"$ref": "#/$defs/tail"}, *({"pattern": f"^[a-z]{{{i},}}$"} for i in range(3, n + 1))]}}}


def ref_alternatives(n: int) -> dict:
    """A value that is an integer or one of `n` kinds of array of such values: `n` self-referencing
    alternatives of one anyOf, half of them behind a nested anyOf (llguidance flattens it in)."""
    arrays = [{"type": "array", "items": {"$ref": "#/$defs/v"}, "maxItems": i + 1} for i in range(n)]
    either = {"anyOf": [*arrays[: n // 2], {"anyOf": arrays[n // 2:]}, {"type": "integer"}]}
    return {"$defs": {"v": either}, "type": "object", "properties": {"v": {"$ref": "#/$defs/v"}}}


def multiple_of(n: int) -> dict:
    """Numbers whose multipleOf values have `n` as their least common multiple (n = 2^a 5^b m)."""
    twos = (n & -n).bit_length() - 1
    return {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": n >> twos},
                                             "b": {"type": "number", "multipleOf": 2 ** twos / 10 ** 3}}}


def ref_depth(n: int) -> dict:
    """Arrays nested `n` levels deep (the object and its property first), the rest through a chain of
    refs, and a recursive ref back to the top that adds no depth."""
    chain = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(n - 2)}
    chain[f"d{n - 2}"] = {"type": "integer"}
    return {"$defs": chain, "type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}, "b": {"$ref": "#"}}}


@pytest.fixture
def no_compile_of(monkeypatch):
    """Makes llguidance refuse (AssertionError) any grammar whose text holds `marker`: a schema the
    shape check must refuse first never reaches the compiler (where it would run for minutes)."""
    import types

    import llguidance

    from helios.frontend.structured import grammar

    markers = []
    real = llguidance.LLMatcher

    class Matcher:
        def __call__(self, tokenizer, source, *args, **kwargs):
            assert not any(marker in source for marker in markers), "the compiler got an unbounded shape"
            return real(tokenizer, source, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    names = {name: getattr(llguidance, name) for name in dir(llguidance) if not name.startswith("__")}
    monkeypatch.setattr(grammar, "llguidance", types.SimpleNamespace(**{**names, "LLMatcher": Matcher()}))
    return markers.append


@pytest.mark.parametrize("shape, limit, reason", [
    (pattern_properties, 64, "65 patternProperties: at most 64"),
    (joint_patterns, 8, "match 9 patterns together .*: at most 8"),
    (ref_alternatives, 128, "anyOf/oneOf with 129 alternatives that hold a \\$ref .*: at most 128"),
    (multiple_of, 10_000, "multipleOf values whose least common multiple is 10001 .*: at most 10000"),
    (ref_depth, 128, "nested more than 128 levels deep through its \\$refs"),
])
def test_shapes_that_compile_in_unbounded_time_are_400s_before_compiling(served, no_compile_of, shape, limit, reason):
    """2000 patternProperties (63 kB) or 50 patterns on one string held a worker for minutes inside
    llguidance, which no `LIMITS` bound, as did 64 x 64 nested self-referencing anyOf alternatives
    (55 kB) or four multipleOf values near 1000 in one anyOf (171 bytes); one past the bound is now
    refused before any compile, and the bound itself still compiles. A chain of 1200 $refs (50 kB)
    overflowed an 8 MiB native stack (the engine process recompiles on its main thread): a segfault."""
    case = served["qwen"]
    bounded = chat(case, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": shape(limit)}})
    assert case.model.prepare_chat(bounded).grammar is not None
    no_compile_of(json.dumps(shape(limit + 1))[-40:])
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": shape(limit + 1)}}
    with pytest.raises(GrammarError, match=reason) as caught:
        case.model.prepare_chat(chat(case, response_format=rf))
    assert (caught.value.http_status, caught.value.param) == (400, "response_format")
    with pytest.raises(GrammarError, match=f"tool 'f' parameters: .*{reason}") as caught:
        case.model.prepare_chat(chat(case, tools=[tool(shape(limit + 1))], tool_choice="required"))
    assert (caught.value.http_status, caught.value.param) == (400, "tools[0].function.parameters")


def test_joint_patterns_count_any_of_branches_once_and_stop_at_cycles():
    def request(schema):
        return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))

    either = {"anyOf": [{"pattern": "a"}, {"allOf": [{"pattern": "b"}, {"pattern": "c"}]}]}
    assert shape_error(request({"allOf": [either] * 4})) == ""  # 4 x 2: the larger branch of each
    assert "9 patterns" in shape_error(request({"pattern": "x", "allOf": [either] * 4}))
    looping = {"$defs": {"a": {"pattern": "x", "allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    assert shape_error(request(looping)) == ""
    chain = {"$defs": {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]} for i in range(300)}, "$ref": "#/$defs/d0"}
    chain["$defs"]["d300"] = {"type": "string"}
    assert "too many" in shape_error(request(chain))
    assert shape_error(GrammarRequest(GrammarKind.REGEX, "(" * 50)) == ""


def test_ref_alternatives_count_nested_anyof_but_not_through_refs_or_without_refs():
    def request(schema):
        return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema))

    nested = {"anyOf": [{"anyOf": [{"$ref": "#"}] * 11 + [{"type": "integer"}]} for _ in range(12)]}
    assert "132 alternatives" in shape_error(request(nested))  # 12 x 11 flattened; the integers hold no $ref
    inner = {"type": "object", "properties": {"a": {"type": "array", "items": {"$ref": "#"}}}}
    assert "129 alternatives" in shape_error(request({"oneOf": [inner] * 129, "anyOf": [{"type": "null"}]}))
    assert "129 alternatives" in shape_error(request({"anyOf": [inner] * 100, "oneOf": [inner] * 29}))
    via_ref = {"$defs": {"u": {"anyOf": [{"$ref": "#"}] * 128 + [{"type": "integer"}]}}, "anyOf": [{"$ref": "#/$defs/u"}] * 128}
    assert shape_error(request(via_ref)) == ""  # a ref stays a rule of its own: 128 and 128, not 16384
    consts = {"anyOf": [{"const": f"Zone/{i}", "description": f"zone {i}"} for i in range(2000)]}
    assert shape_error(request(consts)) == ""


def test_ref_depth_counts_a_ref_as_its_target_and_recursion_as_one_level():
    def error(schema):
        return shape_error(GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps(schema)))

    assert error(ref_depth(128)) == "" and "more than 128 levels" in error(ref_depth(129))
    tree = {"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    assert error(tree) == ""
    shared = {"$defs": {f"d{i}": {"prefixItems": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(200)}}
    shared["$defs"]["d200"] = {"type": "integer"}
    assert "more than 128 levels" in error({**shared, "$ref": "#/$defs/d0"})  # a DAG of 2^200 paths, walked once per node
    unused = {"$defs": ref_depth(300)["$defs"], "type": "integer"}
    assert error(unused) == ""  # definitions no ref reaches nest nothing


def test_multiple_of_values_are_scaled_to_integers_and_combined_by_least_common_multiple():
    def error(*values):
        properties = {f"p{i}": {"type": "number", "multipleOf": value} for i, value in enumerate(values)}
        return shape_error(GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({"type": "object", "properties": properties})))

    assert error(0.01, 0.25, 5, 50, 0.5, 1e-9, 2500, 10_000) == ""  # lcm 10000: 0.25 counts as 25
    assert error(15, 60, 3600, 0.05) == ""
    assert "least common multiple is 61200" in error(0.25, 3600, 17)
    assert "is 30000" in error(10_000, 3)
    assert "is 999983" in error(999983)
    assert "is about 1e400" in error(10 ** 400)
    assert error(True, 0, "7", None, [3]) == ""  # not numbers, or 0: the compile reports them
    # A negative one llguidance compiled as its absolute value (-2 wrote 4): refused here.
    assert error(-5) == "multipleOf -5 at /properties/p0: it must be greater than 0"


REALISTIC = {
    # OpenAI's structured-output UI example: a recursive component tree.
    "ui": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
        "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
        "attributes": {"type": "array", "items": {"$ref": "#/$defs/attribute"}}},
        "required": ["type", "label", "children", "attributes"], "additionalProperties": False,
        "$defs": {"attribute": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                                "required": ["name", "value"], "additionalProperties": False}}},
    # A Pydantic-style tool of 250 optional model fields, a 120-way union of models, a 300-way anyOf of consts.
    "pydantic": {"type": "object", "$defs": {
        **{f"M{i}": {"type": "object", "properties": {"kind": {"const": f"m{i}"}, "x": {"type": "number", "multipleOf": 0.01}},
                     "required": ["kind"]} for i in range(120)}},
        "properties": {**{f"f{i}": {"anyOf": [{"$ref": f"#/$defs/M{i % 120}"}, {"type": "null"}], "default": None} for i in range(250)},
                       "union": {"anyOf": [{"$ref": f"#/$defs/M{i}"} for i in range(120)]},
                       "minutes": {"type": "integer", "multipleOf": 15, "minimum": 0, "maximum": 1440},
                       "zone": {"anyOf": [{"const": f"Zone/{i}", "description": f"zone {i}"} for i in range(300)]}}},
}


@pytest.mark.parametrize("name", list(REALISTIC))
def test_realistic_schemas_near_the_shape_bounds_compile(served, name):
    case = served["qwen"]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": REALISTIC[name]}}
    assert case.model.prepare_chat(chat(case, response_format=rf)).grammar is not None
    if name != "ui":  # the tool-call grammar refuses recursive parameters (circular references with sibling keys)
        assert case.model.prepare_chat(chat(case, tools=[tool(REALISTIC[name])], tool_choice="required")).grammar is not None


def test_a_raw_enum_whose_every_value_holds_the_closer_is_a_400_not_free_text(served):
    """A plain string parameter whose enum values all hold the value closer fell back to free text
    (any value, none of the enum's); now a 400 naming the parameter. Writable values are kept."""
    case = served["qwen"]
    closing = {"type": "object", "properties": {"a": {"enum": ["x</parameter>", "</parameter>"]}}, "required": ["a"]}
    with pytest.raises(GrammarError, match="tool 'f' parameter 'a': .*holds the value closer") as caught:
        case.model.prepare_chat(chat(case, tools=[tool(closing)], tool_choice="required"))
    assert (caught.value.http_status, caught.value.param) == (400, "tools[0].function.parameters.properties.a")
    mixed = {"type": "object", "properties": {"a": {"enum": ["ok", "x</parameter>"]}}, "required": ["a"]}
    prepared = case.model.prepare_chat(chat(case, tools=[tool(mixed)], tool_choice="required"))
    head = ids_of(case.tokenizer, "</think>", "<tool_call>", "\n<function=f>\n<parameter=a>\n")
    assert accepts(prepared.grammar, head + plain_ids(case.tokenizer, "ok\n</parameter>"))
    assert not accepts(prepared.grammar, head + plain_ids(case.tokenizer, "x</"))


def test_a_tool_call_grammar_past_the_compile_limits_is_a_400_naming_tools(served, monkeypatch):
    """The whole tool-call grammar can fail to compile though each tool schema passed its check (here
    under a tiny grammar-size limit); its GrammarError named no param."""
    import llguidance

    case = served["qwen"]
    compiler = case.model._constraints._compiler
    tiny = llguidance.LLParserLimits(max_grammar_size=100)

    def matcher(lark, answer):
        source = compiler.document_text(lark, answer)
        return llguidance.LLMatcher(compiler._tokenizer, source, log_level=0, limits=tiny), source

    monkeypatch.setattr(compiler, "_matcher", matcher)
    with pytest.raises(GrammarError, match="tool-call grammar") as caught:
        case.model.prepare_chat(chat(case, tools=[tool(PATTERNED)], tool_choice="required"))
    assert (caught.value.http_status, caught.value.param) == (400, "tools")
