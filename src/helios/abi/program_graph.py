"""What a stored program graph may contain, checked on its JSON before torch deserializes it.

A program image (`helios.abi.program_image`) holds torch.export's JSON serialization of a graph.
Deserializing that JSON is not automatically safe: torch resolves every node target by walking
attributes from ``torch``, ``operator`` or ``math`` and calls whatever it finds when the program
runs (``torch.os.system`` is reachable that way), parses symbolic expressions with
``sympy.sympify`` (an ``eval``), and compiles the program's guard code into a Python function. So
`check_program_graph` walks the parsed JSON first and refuses, with `ForbiddenProgramError`:

- a node target or operator argument that is not an ``aten`` or ``helios`` op overload (``aten``
  ops that reach outside tensors, such as ``aten::save`` and ``aten::from_file``, excluded), one
  of a few higher-order ops, or a symbolic-shape operator;
- a symbolic expression outside a small grammar: integer literals, symbol names (``s0``, bare or
  quoted), arithmetic and comparison operators, and calls of an allow-listed set of sympy
  constructors and torch's sympy functions (no attribute access, no other strings or names);
- guard code, custom (script) objects, extension operators, node metadata beyond what torch
  writes (stack traces, module paths, source functions), and top-level fields this check does not
  know.

The checker never imports, evaluates or deserializes anything; it only reads strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from helios.errors import LoadError

NAMESPACE = "helios"
MAX_EXPRESSION_CHARS = 4096

_OP_TARGET = re.compile(r"^torch\.ops\.(aten|helios)\.(\w+)\.(\w+)$")
# aten ops whose effects reach outside tensors (files, logging, streams); a program never needs them.
_DENIED_ATEN = frozenset({"save", "from_file", "_print", "warn", "wait", "record_stream", "_test_warn_in_autograd"})
_HIGHER_ORDER = frozenset({
    "torch.ops.higher_order.auto_functionalized", "torch.ops.higher_order.auto_functionalized_v2",
    "torch.ops.higher_order.with_effects", "torch.ops.higher_order.cond",
})
_SYMBOLIC = frozenset(
    [f"_operator.{name}" for name in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt",
        "le", "gt", "ge", "and_", "or_", "not_", "getitem")]
    + [f"torch.{name}" for name in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt")]
    + [f"math.{name}" for name in ("ceil", "floor", "trunc")]
)
_TOP_LEVEL = frozenset({
    "graph_module", "opset_version", "range_constraints", "schema_version", "verifiers", "torch_version",
    "guards_code", "dialect",
})
_NODE_METADATA = frozenset({"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom"})
_FORBIDDEN_KEYS = frozenset({"as_custom_obj", "custom_obj", "custom_obj_meta"})

_SYMBOL = r"[a-z]+\d+"
_EXPRESSION_TOKEN = re.compile(
    rf"\s+|(?P<name>[A-Za-z_]\w*)|(?P<quoted>'{_SYMBOL}')|(?P<number>\d+(?:\.\d+)?(?:e-?\d+)?)"
    r"|\*\*|//|==|!=|<=|>=|[-+*/%()<>,=&|~]"
)
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "Eq", "Ne",
    "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Equality",
    "Unequality", "And", "Or", "Not", "true", "false", "True", "False", "oo", "floor", "ceiling", "Piecewise",
    "ITE", "One", "Zero", "NegativeOne", "Half", "Infinity", "NegativeInfinity", "int_oo", "IntInfinity",
    "NegativeIntInfinity",
    # torch.utils._sympy.functions, which torch's deserializer passes to sympify by name
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "OpaqueUnaryFn_sqrt",
    # sympy assumptions, passed as keywords of Symbol(...)
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "infinite",
    "extended_real", "commutative", "zero", "nonzero", "even", "odd", "rational",
})


class ForbiddenProgramError(LoadError):
    """A stored program graph holds something a program image may not: code, a callable that is
    not an ABI or aten op, a custom object, or an expression outside the symbolic-shape grammar."""


def check_program_graph(graph: object) -> frozenset[str]:
    """Raise `ForbiddenProgramError` unless the parsed JSON of an ExportedProgram holds only what a
    program image may (see the module docstring). `graph` is what ``json.loads`` returned. Returns
    every operator name the graph calls or passes to a higher-order op (`graph_targets`' names),
    found by the same walk."""
    if not isinstance(graph, dict):
        raise ForbiddenProgramError("the program graph is not a JSON object")
    unknown = sorted(set(graph) - _TOP_LEVEL)
    if unknown:
        raise ForbiddenProgramError(f"the program graph has fields this runtime does not check: {unknown}")
    if graph.get("guards_code"):
        raise ForbiddenProgramError("the program graph carries guard code (Python source)")
    for name in graph.get("range_constraints") or {}:
        _check_symbol(name)
    targets = set()
    for key, value in _entries(graph, _CHECKED_KEYS):
        _check_entry(key, value)
        if key in _TARGET_KEYS:
            targets.add(value)  # a string: `_check_entry` refused anything else
    return frozenset(targets)


def graph_targets(graph: object) -> Iterator[str]:
    """Every operator name the graph calls or passes to a higher-order op."""
    for _, value in _entries(graph, _TARGET_KEYS):
        if isinstance(value, str):
            yield value


_TARGET_KEYS = frozenset({"target", "as_operator"})
_CHECKED_KEYS = _FORBIDDEN_KEYS | _TARGET_KEYS | {"expr_str", "metadata"}  # what `_check_entry` looks at


def _entries(value: object, keys: frozenset[str]) -> Iterator[tuple[str, object]]:
    """Every (key, value) with a key in `keys` of every JSON object inside `value`, iteratively (no
    recursion limit). Only objects and lists are walked into: nothing else holds entries."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        if type(item) is dict:
            for key, child in item.items():
                if key in keys:
                    yield key, child
                kind = type(child)
                if kind is dict:
                    push(child)
                elif kind is list:
                    extend(child)
        elif type(item) is list:
            extend(item)


def _check_entry(key: str, value: object) -> None:
    if key in _FORBIDDEN_KEYS:
        raise ForbiddenProgramError(f"the program graph holds a custom object ({key})")
    if key == "target" or key == "as_operator":
        if not isinstance(value, str):
            raise ForbiddenProgramError(f"an operator name is not a string: {value!r:.80}")
        check_target(value)
    elif key == "expr_str":
        check_expression(value)
    elif key == "metadata" and isinstance(value, dict):
        extra = sorted(k for k, v in value.items() if k not in _NODE_METADATA or not isinstance(v, str))
        if extra:
            raise ForbiddenProgramError(f"graph metadata holds unexpected fields {extra[:5]}")


_ALLOWED: set[str] = set()  # targets found allowed in this process (a program names each many times)


def check_target(target: str) -> None:
    """Raise unless `target` names an allowed op overload, higher-order op or symbolic operator."""
    if target in _HIGHER_ORDER or target in _SYMBOLIC or target in _ALLOWED:
        return
    _check_op_target(target)
    _ALLOWED.add(target)


def _check_op_target(target: str) -> None:
    match = _OP_TARGET.match(target)
    if match is None:
        raise ForbiddenProgramError(f"the program calls {target!r:.120}, which is not an ABI or aten op")
    namespace, name, overload = match.groups()
    if namespace == "aten" and (name in _DENIED_ATEN or name.startswith("_test")):
        raise ForbiddenProgramError(f"the program calls aten::{name}, which reaches outside tensors")
    if namespace == NAMESPACE:
        return  # checked against the manifest and this process's registrations (helios.abi.registry)
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket) or not isinstance(
            getattr(packet, overload, None), torch._ops.OpOverload):
        raise ForbiddenProgramError(f"the program calls {target!r}, which is not an aten op overload here")


def check_expression(expression: object) -> None:
    """Raise unless `expression` is a symbolic-shape expression of the allowed grammar."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ForbiddenProgramError(f"symbolic expression {expression!r:.80} is not a short string")
    position = 0
    while position < len(expression):
        token = _EXPRESSION_TOKEN.match(expression, position)
        if token is None:
            raise ForbiddenProgramError(
                f"symbolic expression {expression!r:.120} has a character outside the grammar at {position}")
        name = token.group("name")
        if name is not None and name not in _SYMPY_NAMES and not re.fullmatch(_SYMBOL, name):
            raise ForbiddenProgramError(f"symbolic expression {expression!r:.120} names {name!r}")
        position = token.end()


def _check_symbol(name: object) -> None:
    if not isinstance(name, str) or not re.fullmatch(_SYMBOL, name):
        raise ForbiddenProgramError(f"range constraint on {name!r:.80}, which is not a symbol name")
