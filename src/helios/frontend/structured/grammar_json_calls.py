"""Tool calls in a JSON-call syntax (`ToolSyntaxKind.JSON_CALLS`) as an llguidance Lark grammar.

When a request forces a call (``tool_choice`` required or a named function) on a model whose tool
syntax is JSON calls, the answer is exactly the family's call block (`json_calls_lark`); under
``parallel_tool_calls: false`` without forcing it is free text, or free text then one call
(`optional_call_lark`). A block is written the way the family's template renders one, with each
call's arguments constrained by the tool's JSON schema (compact JSON; only declared properties
unless the schema allows more):

    Hermes          <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (blocks joined by \\n)
    Mistral         [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]         (no closer: a JSON array)
    Llama 3.x       {"name": "f", "parameters": {...}}                          (no opener: one call)
    DeepSeek        <｜tool▁calls▁begin｜>INVOKE_OPEN f NAME_END ARGS_OPEN {...} ARGS_CLOSE INVOKE_CLOSE ...

The grammar is the answer part only; the reasoning envelope in front of it (`grammar.envelope_lark`)
is the same as for a structured answer. Special-token spellings are generated as their tokens.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_lark import (LarkRules, Speller, Spelling, avoiding, free_text, json_literal,
                                                    lark_of, text_then)
from helios.frontend.structured.grammar_options import OPTIONS_KEY, client_options
from helios.frontend.structured.grammar_tools import ToolSchema
from helios.frontend.structured.grammar_values import ValueStyle, safe_bundle, string_pattern
from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.decoding.syntax import JsonCallSyntax

NEWLINE = "\n"
# Answer text the parser reads as text in a syntax without a block opener (Llama's): it is whitespace,
# or its first other character starts no JSON value the parser would read as the call block
# (`json_calls._answer_start`: `str.lstrip`, whose whitespace holds U+001C-U+001F and U+0085 beside
# the regex's \s).
_NO_JSON_START = "/(?s:[\\s\\x1c-\\x1f\\x85]+|[\\s\\x1c-\\x1f\\x85]*[^\\s\\x1c-\\x1f\\x85{\\[].*)/"


def arguments_schema(tool: ToolSchema, json_options: Mapping, closer: str = "") -> str:
    """The arguments schema; like the tag grammars, a call writes only the declared properties and
    ignores the keywords llguidance does not implement (``lenient``, as the check of the tool's
    schema and the tag grammars do; they were an error here, a 400 the check had passed). With a
    block ``closer``, which the parser finds as text, no string or key spells it (`safe_schema`,
    as in tag syntaxes: a string argument holding it ended the block inside the JSON). The declared
    properties are those behind a top-level ``$ref`` too (pydantic's recursive models), as the tag
    grammars read them (`tool_properties`): a call could add any key there."""
    root = tool.document.deref(tool.parameters)
    schema = dict(root) if isinstance(root, Mapping) else {}
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
    if closer:
        original = schema
        schema = safe_bundle(schema, tool.document, string_pattern(ValueStyle(), closer))
        _check_closer_free(tool, schema, original, closer)
    else:  # the target's refs, standalone (the top level it came from holds their definitions)
        schema = tool.document.bundled(schema)
    # A call's arguments are a JSON object, whatever else the top level allows (`object_parameters`);
    # set after the safe bundle, which would give a bare object top level keys of its own to intersect.
    schema["type"] = "object"
    # The tool's own options are those a client may set (`grammar_options`; `parameters_request`
    # refused the others before this grammar is built), over the server's defaults, under its lenient.
    schema[OPTIONS_KEY] = {**json_options, **client_options(tool.parameters), "lenient": True}
    return json.dumps(schema, ensure_ascii=False)


def _check_closer_free(tool: ToolSchema, schema: Mapping, original: Mapping, closer: str,
                       path: tuple[str, ...] = (), bundle: SchemaDocument | None = None,
                       walked: set[str] | None = None) -> None:
    """GrammarError naming the first required parameter (a nested object's required key included)
    whose every enum/const value holds the block `closer`: the safe schema leaves it no value
    (``enum: []``) where the tool's `original` schema had some, and the call could not be written
    (llguidance's bare "Unsatisfiable schema" was the 400, naming neither the tool nor the
    parameter). A client's own empty enum is left to that 400. A parameter's ``$ref`` is followed
    on both sides (pydantic writes an enum or a nested model as one): in the safe `bundle` (the
    document `schema` belongs to), each ref once in the whole walk (`walked`: a definition checked
    once is checked for every path to it, and shared or recursive ones stay linear), and in the
    tool's own document."""
    bundle = bundle if bundle is not None else SchemaDocument(schema)
    walked = walked if walked is not None else set()
    properties, originals = schema.get("properties"), original.get("properties")
    required = schema.get("required")
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return
    originals = originals if isinstance(originals, Mapping) else {}
    for key in required:
        value = _walk(bundle, properties.get(key) if isinstance(key, str) else None, walked)
        if not isinstance(value, Mapping):
            continue
        before = tool.document.deref(originals.get(key))
        before = before if isinstance(before, Mapping) else {}
        if _emptied(tool, bundle, value, before, walked):
            where = "tools" if tool.index is None else f"{tool.param}.properties.{path[0] if path else key}"
            raise GrammarError(f"tool {tool.name!r} parameter {'.'.join((*path, key))!r}: each of its enum/const "
                               f"values holds {closer!r}, which ends this model's tool-call block, so none can be "
                               "written", where)
        _check_closer_free(tool, value, before, closer, (*path, key), bundle, walked)


def _walk(bundle: SchemaDocument, schema: Any, walked: set[str]) -> Any:
    """`schema` with its ref followed in `bundle` (`SchemaDocument.deref`), or None when that ref
    was walked before; records the ref in `walked`."""
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    if not isinstance(ref, str):
        return schema
    if ref in walked:
        return None
    walked.add(ref)
    return bundle.deref(schema)


def _emptied(tool: ToolSchema, bundle: SchemaDocument, value: Mapping, before: Mapping, walked: set[str]) -> bool:
    """Whether the safe `value` allows no value where the tool's `before` listed enum/const ones: its
    own ``enum`` is empty, or an ``allOf`` conjunct's is (pydantic v1 wrote a described enum field as
    ``allOf: [{$ref: ...}]``), refs followed as in `_check_closer_free`."""
    if value.get("enum") == [] and (before.get("enum") or "const" in before):
        return True
    conjuncts, originals = value.get("allOf"), before.get("allOf")
    if not isinstance(conjuncts, list) or not isinstance(originals, list):
        return False
    for conjunct, original in zip(conjuncts, originals):  # the safe schema keeps their order
        conjunct, original = _walk(bundle, conjunct, walked), tool.document.deref(original)
        if isinstance(conjunct, Mapping) and isinstance(original, Mapping) and _emptied(
                tool, bundle, conjunct, original, walked):
            return True
    return False


def _call_rules(syntax: JsonCallSyntax, speller: Speller, tools: Sequence[ToolSchema], json_options: Mapping,
                opened: bool = False) -> list[str]:
    """Rules ``call`` (one call of one of `tools`) and its parts. `opened`: the block opener, which
    is the invocation opener (Mistral's ``[TOOL_CALLS]NAME[ARGS]``), was written already, so the
    call starts at its name."""
    rules, names = [], []
    for i, tool in enumerate(tools):
        names.append(f"call_{i}")
        arguments = f"args_{i}"
        rules.append(f"{arguments}: %json {arguments_schema(tool, json_options, syntax.block_close)}")
        if syntax.name_key:
            head = '{"%s": %s, "%s": ' % (syntax.name_key, json.dumps(tool.name), syntax.arguments_key)
            rules.append(f"call_{i}: {json_literal(head)} {arguments} \"}}\"")
        else:
            parts = ["" if opened else lark_of(speller(syntax.invoke_open)), json_literal(tool.name),
                     lark_of(speller(syntax.name_end)),
                     lark_of(speller(syntax.arguments_open)), arguments, lark_of(speller(syntax.arguments_close)),
                     lark_of(speller(syntax.invoke_close))]
            rules.append(f"call_{i}: " + " ".join(part for part in parts if part))
    rules.append("call: " + " | ".join(names))
    return rules


def json_calls_lark(syntax: JsonCallSyntax, speller: Speller, tools: Sequence[ToolSchema], single: bool,
                    json_options: Mapping) -> str:
    """A Lark grammar (``start``) writing one (`single`) or more forced calls in `syntax`."""
    if not tools:
        raise ValueError("forced calls need at least one callable tool")
    rules = _call_rules(syntax, speller, tools, json_options)
    opener, closer = lark_of(speller(syntax.block_open)), lark_of(speller(syntax.block_close))

    def repeated(item: str, separator: str) -> str:  # one item when single (a bare group was exactly two)
        return item if single else f"{item} ({json_literal(separator)} {item})*"

    if not syntax.name_key and syntax.invoke_open == syntax.block_open:
        # Each call's own opener opens the block (Mistral's `[TOOL_CALLS]NAME[ARGS]{...}`, calls written
        # back to back): a block opener before it wrote `[TOOL_CALLS][TOOL_CALLS]`, which the model never does.
        body = f"{'call' if single else 'call+'} {closer}"
    elif not syntax.name_key:
        body = f"{opener} {repeated('call', NEWLINE)} {closer}"
    elif not syntax.block_open:
        body = "call"  # the answer itself is the call: one per output
    elif not syntax.block_close:
        body = f"{opener} \"[\" {repeated('call', ', ')} \"]\""
    else:
        body = repeated("block", NEWLINE)
        rules.append(f"block: {opener} \"\\n\" call \"\\n\" {closer}")
    return "\n".join([f"start: {body}", *rules]) + "\n"


def optional_call_lark(syntax: JsonCallSyntax, speller: Speller, tools: Sequence[ToolSchema], json_options: Mapping,
                       avoid: Sequence[Spelling] = ()) -> str:
    """A Lark grammar (``start``) for ``parallel_tool_calls: false`` without a forced call: free
    answer text, or text then exactly one call block in `syntax` (the block `json_calls_lark` writes
    for one call), ending the output. The text never spells the block opener (the parser would open
    a block there) nor any of `avoid`; without an opener (Llama) the answer is the call or text
    whose first non-whitespace character starts no JSON value (`_NO_JSON_START`). So the model
    cannot write a second call, where the parser would have read every call it wrote."""
    if not tools:
        raise ValueError("a call needs at least one callable tool")
    rules = LarkRules()
    calls = _call_rules(syntax, speller, tools, json_options,
                        opened=not syntax.name_key and syntax.invoke_open == syntax.block_open)
    if not syntax.block_open:
        body = f"call | {rules.terminal('text', avoiding(_NO_JSON_START, avoid))}?"
    else:
        opener, closer = speller(syntax.block_open), lark_of(speller(syntax.block_close))
        if not syntax.name_key:  # DeepSeek's markup calls; Mistral's, whose opener opened the call
            tail = f"call {closer}"
        elif not syntax.block_close:
            tail = '"[" call "]"'
        else:
            tail = f'"\\n" call "\\n" {closer}'
        upto_open = text_then(rules, [opener], avoid)[0]
        body = f"{upto_open} {tail} | {free_text(rules, [opener, *avoid])}?"
    return rules.text(body) + "\n".join(calls) + "\n"
