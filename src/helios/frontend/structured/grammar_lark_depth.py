"""How deep llguidance's compile of a request's Lark grammar recurses, bounded before it sees one.

llguidance compiles a Lark grammar recursively in native code: one chain of frames per rule or token
reached through another and per group nested in a body, recursion included (a cycle of 3,000 rules
recurses through all of them). A chain of about 2,700 rules (35 kB of text, within the 64 KiB a
request may send) overflows an 8 MiB stack, which kills the process with a segfault rather than
raising: the engine process compiles every admitted grammar again on its main thread, so a
grammar the serving process's preparation (large stack) passed took the engine process down and the
server with it. `lark_shape_error` refuses, as a client's error, a grammar past `MAX_LARK_DEPTH`
levels, and a ``%json`` schema inside it past the shape bounds a ``json_schema`` request has
(`grammar_shapes`).

The levels are counted on llguidance's own lexemes (comments, strings, regexes, special tokens and
``%json``/``%regex``/``%llguidance`` JSON skipped): a definition's depth is one more than the deepest
of its references, each at its group nesting there, or its deepest nesting. Mutually recursive
definitions count as the sum of their own levels (an upper bound on any path through them), and a
``%lark { ... }`` grammar nested in a body counts as its own definitions, one group deeper; so the
count never falls below what the compile recurses through. Real grammars stay far below the bound
(Lark's own Python grammar: 140 levels).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any, Iterator

from helios.frontend.structured.grammar_shapes import schema_shape_error

# About 3 kB of native stack per level (a rule chain overflowed 8 MiB at 2,700 levels, a cycle at
# 3,000, rules holding 10 nested groups each at 400 rules): a third of that, beside a %json schema's
# own MAX_REF_DEPTH levels and the tool-call grammar around an answer.
MAX_LARK_DEPTH = 1000

_LEXEME = re.compile(r"""
    (?P<skip>(?:\#|//)[^\n]*|[ \t\r]+)
  | (?P<newline>\n[ \t\r\n]*)
  | (?P<json>%json|%regex|%llguidance)
  | (?P<nest>%lark)
  | (?P<string>"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4})|[^"\\\x00-\x1f\x7f])*"i?)
  | (?P<regex>/(?:\\.|[^/\\])+/[imslux]*)
  | (?P<special><[^<>\s]+>)
  | (?P<name>!?[_?]?[a-z][_a-z0-9\-]*|_?[A-Z][_A-Z0-9\-]*)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_JSON = json.JSONDecoder()


def lark_shape_error(source: str) -> str:
    """Why llguidance cannot compile the Lark grammar `source` safely, as its error for a client
    ("" when it can, or when the compile itself will report the grammar malformed)."""
    definitions, error = _definitions(source)
    if error:
        return error
    depth = _deepest(definitions)
    if depth > MAX_LARK_DEPTH:
        return (f"rules, tokens and groups nested {depth} levels deep (recursion counted through each rule "
                f"it passes): at most {MAX_LARK_DEPTH} can be compiled safely")
    return ""


# A definition: its deepest group nesting and its references (the nesting there, the name).
_Definition = tuple[int, list[tuple[int, str]]]


def _definitions(source: str) -> tuple[dict[str, _Definition], str]:
    """Each defined name's nesting and references; or the error of a ``%json`` schema inside. A
    ``%lark { ... }`` grammar nested in a body is a scope of its own: its names are prefixed with
    its number, and the body refers to its ``start`` one group deeper."""
    nesting: dict[str, int] = defaultdict(int)
    references: dict[str, list[tuple[int, str]]] = defaultdict(list)
    outer: list[tuple[str, str, int, str]] = []  # the enclosing scopes' (current, last, depth, prefix)
    current, last, head, prefix, depth, position = "", "", "", "", 0, 0
    at_line_start, nests, scopes = True, False, 0
    while position < len(source):
        match = _LEXEME.match(source, position)
        kind, text, position = match.lastgroup, match.group(), match.end()
        if kind == "skip":
            continue
        if kind == "newline":
            at_line_start = True
            continue
        starts_line, at_line_start = at_line_start and depth == 0, False
        opens_nest, nests = nests and text == "{", kind == "nest"
        if opens_nest:
            scopes += 1
            outer.append((current, last, depth, prefix))
            if current:
                references[current].append((depth + 1, f"{scopes}:start"))
            current, last, head, prefix, depth, at_line_start = "", "", "", f"{scopes}:", 0, True
        elif kind == "close" and depth == 0 and outer:
            current, last, depth, prefix = outer.pop()
            head = ""
        elif kind == "json":
            error, position = _embedded_json(source, position, text == "%json")
            if error:
                return {}, error
        elif kind == "name":
            if starts_line:
                head = prefix + text.lstrip("!?")
            elif current:
                references[current].append((depth, prefix + text.lstrip("!?")))
        elif kind == "open":
            depth += 1
            nesting[current] = max(nesting[current], depth)
        elif kind == "close":
            depth = max(depth - 1, 0)
        elif kind == "other" and text == ":" and depth == 0 and head:
            current = last = head
            head = ""
            nesting[current] = max(nesting[current], 0)
        elif starts_line:  # `| alternative` continues the last definition; a statement (%import, ...) none
            current, head = (last if text == "|" else ""), ""
    return {name: (nesting[name], references[name]) for name in nesting if name}, ""


def _embedded_json(source: str, position: int, is_schema: bool) -> tuple[str, int]:
    """(the shape error of a ``%json`` schema, where the JSON value after the keyword ends)."""
    start = len(source) - len(source[position:].lstrip())
    try:
        value, end = _JSON.raw_decode(source, start)
    except (ValueError, RecursionError):
        return "", len(source)  # llguidance reports it (its own JSON nesting limit is 128)
    if not is_schema:
        return "", end
    error = schema_shape_error(json.dumps(value))
    return (f"its %json schema: {error}" if error else ""), end


def embedded_schemas(source: str) -> Iterator[Any]:
    """Each ``%json`` schema inside the Lark grammar `source`, nested ``%lark`` grammars included,
    read on the same lexemes as the depth count (a ``%json`` spelled in a string, regex or comment
    is none); stops at one that is not JSON, which the compile reports."""
    position = 0
    while position < len(source):
        match = _LEXEME.match(source, position)
        position = match.end()
        if match.lastgroup != "json":
            continue
        start = len(source) - len(source[position:].lstrip())
        try:
            value, position = _JSON.raw_decode(source, start)
        except (ValueError, RecursionError):
            return
        if match.group() == "%json":
            yield value


def _deepest(definitions: dict[str, _Definition]) -> int:
    """The most levels any definition's compile recurses through (0 without definitions)."""
    component = _components(definitions)
    members: dict[int, list[str]] = defaultdict(list)
    for name, index in component.items():
        members[index].append(name)
    depth: dict[int, int] = {}
    for index in sorted(members):  # Tarjan numbers components callees first
        names = members[index]
        below = max((nest + depth[component[ref]] for name in names for nest, ref in definitions[name][1]
                     if ref in component and component[ref] != index), default=0)
        if len(names) == 1 and all(ref != names[0] for _, ref in definitions[names[0]][1]):
            depth[index] = 1 + max(definitions[names[0]][0], below)
        else:  # recursion: every member's levels, then the deepest way out
            depth[index] = sum(1 + definitions[name][0] for name in names) + below
    return max(depth.values(), default=0)


def _components(definitions: dict[str, _Definition]) -> dict[str, int]:
    """Tarjan's strongly connected components without recursion: name -> component number, each
    component numbered after every component it references."""
    index_of: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    components = 0
    for root in definitions:
        if root in index_of:
            continue
        work = [(root, iter(definitions[root][1]))]
        index_of[root] = low[root] = len(index_of)
        stack.append(root)
        on_stack.add(root)
        while work:
            name, edges = work[-1]
            for _, ref in edges:
                if ref not in definitions:
                    continue
                if ref not in index_of:
                    index_of[ref] = low[ref] = len(index_of)
                    stack.append(ref)
                    on_stack.add(ref)
                    work.append((ref, iter(definitions[ref][1])))
                    break
                if ref in on_stack:
                    low[name] = min(low[name], index_of[ref])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[name])
                if low[name] == index_of[name]:
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component[member] = components
                        if member == name:
                            break
                    components += 1
    return component
