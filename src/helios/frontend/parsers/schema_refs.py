"""Local ``$ref``s of one JSON-schema document: checked once, then resolved on demand.

Clients built on pydantic send schemas such as ``{"properties": {"loc": {"$ref": "#/$defs/Location"}},
"$defs": {...}}``, often recursive (a tree node whose children refer to the node). A `SchemaDocument`
wraps one whole document (a tool's ``parameters`` or a ``response_format`` schema) and

- checks, when built, every ``$ref`` in it: it must be a fragment of this document, either a JSON
  pointer (``#``, ``#/$defs/NAME``, ``#/definitions/NAME``, ``#/properties/a/items``; percent-decoded,
  then ``~1`` -> ``/`` and ``~0`` -> ``~``) or a plain name declared by an ``$anchor``, and point at a
  schema (an object or a boolean); no chain of refs may lead back to itself without passing through
  a subschema. Anything else (``http://...``, another file, a missing definition) raises
  `SchemaRefError` (HTTP 400) naming the ref;
- `deref` follows a schema's own ``$ref`` chain (keywords beside a ``$ref`` win over the target's);
- `bundled` copies a subschema into a standalone document whose refs all point into its own
  ``$defs``, one definition per distinct target, so recursion stays a ref and is never expanded.

Checking walks the document tree without following refs (finite, iterative). Callers that follow
refs themselves must keep the refs on their path and stop at a repeat. A document is immutable
after construction and never mutates the schema it wraps; share it read-only.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote

from helios.errors import RequestError

MAX_BUNDLED_NODES = 100_000  # a bundle copies each target once; this bounds pathological fan-out
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})  # JSON values, not schemas
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_INDEX = re.compile(r"0|[1-9][0-9]*")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


class SchemaRefError(RequestError):
    """A ``$ref`` in a request's JSON schema that is not local, does not resolve, or loops; `param`
    names the request field holding the schema (the document's ``param``)."""


class SchemaDocument:
    """One JSON-schema document and its checked local refs (see the module docstring).

    ``where`` names the document in error messages (``tool 'f' parameters``), ``param`` the request
    field that holds it (``tools``, ``response_format``), which its errors carry.
    """

    def __init__(self, root: Any, where: str = "schema", param: str | None = None):
        self.root = root
        self.where = where
        self.param = param
        self._anchors: dict[str, Any] = {}
        self._targets: dict[str, Any] = {}
        refs = []
        for node in _schema_nodes(root):
            anchor = node.get("$anchor")
            if isinstance(anchor, str):
                self._anchors.setdefault(anchor, node)
            if "$ref" in node:
                refs.append(node["$ref"])
        for ref in refs:
            if not isinstance(ref, str):
                raise self._error(repr(ref), "is not a string")
            self._targets.setdefault(ref, self._lookup(ref))
        self._check_chains()

    def resolve(self, ref: str) -> Any:
        """The schema ``ref`` points at; SchemaRefError if it does not."""
        target = self._targets.get(ref)
        return target if target is not None or ref in self._targets else self._lookup(ref)

    def deref(self, schema: Any) -> Any:
        """``schema`` with its own ``$ref`` chain followed: the target with the ref's sibling
        keywords laid over it (a new mapping), or ``schema`` itself when it has no ref."""
        seen: set[str] = set()
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if ref in seen:
                raise self._error(ref, "refers to itself")
            seen.add(ref)
            target = self.resolve(ref)
            rest = {key: value for key, value in schema.items() if key != "$ref"}
            if not isinstance(target, Mapping):
                return rest if target is True and rest else target
            schema = {**target, **rest}
        return schema

    def follow(self, schema: Any, visiting: frozenset[str]) -> tuple[Any, frozenset[str]] | None:
        """`deref` of ``schema`` on a walk that has followed the refs in ``visiting``: (the schema,
        ``visiting`` with its ref), or None when its ref is already on the walk (a recursion, which
        adds nothing where a walk takes the least fixed point)."""
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str):
            return schema, visiting
        if ref in visiting:
            return None
        return self.deref(schema), visiting | {ref}

    def reachable(self, schema: Any) -> Iterator[Mapping]:
        """Every mapping in schema position under ``schema`` (a subschema of this document), the
        targets of its refs included, each target walked once: where a keyword may hold. Data
        keywords' values (``enum``, ``default`` ...) and annotation text are no schemas."""
        seen: set[str] = set()
        stack = [schema]
        while stack:
            for node in _schema_nodes(stack.pop()):
                yield node
                ref = node.get("$ref")
                if isinstance(ref, str) and ref not in seen:
                    seen.add(ref)
                    stack.append(self.resolve(ref))

    def bundled(self, schema: Any, reserved: Iterable[str] = ()) -> Any:
        """A standalone copy of ``schema`` (a subschema of this document) whose refs point into its
        own ``$defs``; definition names avoid ``reserved``. Its original ``$defs``/``definitions``
        are dropped (every ref they served is rewritten)."""
        bundle = _Bundle(self, set(reserved))
        out = bundle.copy(schema)
        if not isinstance(out, dict):
            return out
        out.pop("definitions", None)
        out.pop("$defs", None)
        definitions = bundle.definitions()
        if definitions:
            out["$defs"] = definitions
        return out

    def _lookup(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise self._error(ref, "is not local: only refs within the same schema ('#/$defs/NAME', '#/...') "
                                   "are supported")
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            if fragment not in self._anchors:
                raise self._error(ref, f"does not resolve: no $anchor {fragment!r}")
            return self._anchors[fragment]
        node, at = self.root, "#"
        for token in fragment.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and _INDEX.fullmatch(token) and int(token) < len(node):
                node = node[int(token)]
            else:
                raise self._error(ref, f"does not resolve: nothing at {token!r} under {at!r}")
            at = f"{at}/{_escape(token)}"
        if not isinstance(node, (Mapping, bool)):
            raise self._error(ref, f"points at a {type(node).__name__}, not a schema")
        return node

    def _check_chains(self) -> None:
        """No ref may reach itself through schemas that are only refs (no subschema in between)."""
        settled: set[str] = set()
        for start in self._targets:
            path: list[str] = []
            ref: str | None = start
            while ref is not None and ref not in settled:
                if ref in path:
                    raise self._error(ref, f"refers to itself through {' -> '.join(path[path.index(ref):] + [ref])}")
                path.append(ref)
                target = self._targets[ref]
                ref = target.get("$ref") if isinstance(target, Mapping) else None
                # A target outside schema position (a ``properties`` map holding a parameter named
                # "$ref", a data keyword's value) may carry a "$ref" key that is no ref checked above.
                ref = ref if isinstance(ref, str) and ref in self._targets else None
            settled.update(path)

    def _error(self, ref: str, problem: str) -> SchemaRefError:
        return SchemaRefError(f"{self.where}: $ref {ref!r} {problem}", self.param)


class _Bundle:
    """One `SchemaDocument.bundled` call: copies nodes, names each distinct ref target once."""

    def __init__(self, document: SchemaDocument, taken: set[str]):
        self._document = document
        self._taken = taken
        self._names: dict[int, str] = {}  # id(target) -> definition name
        self._pending: list[tuple[str, Any]] = []
        self._num_nodes = 0

    def copy(self, node: Any, is_name_map: bool = False) -> Any:
        if isinstance(node, list):
            return [self.copy(item) for item in node]
        if not isinstance(node, Mapping):
            return node
        self._num_nodes += 1
        if self._num_nodes > MAX_BUNDLED_NODES:
            raise SchemaRefError(f"{self._document.where}: too large once its $refs are resolved", self._document.param)
        out = {}
        for key, value in node.items():
            if is_name_map:
                out[key] = self.copy(value)
            elif key == "$ref" and isinstance(value, str):
                out[key] = f"#/$defs/{self._name(value)}"
            elif key in _DATA_KEYWORDS:
                out[key] = value  # shared, never mutated: callers build new mappings
            else:
                out[key] = self.copy(value, key in _NAME_MAPS)
        return out

    def definitions(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while self._pending:  # copying a target may name further targets
            name, target = self._pending.pop()
            out[name] = self.copy(target)
        return out

    def _name(self, ref: str) -> str:
        target = self._document.resolve(ref)
        name = self._names.get(id(target))
        if name is None:
            stem = _NOT_NAME.sub("_", unquote(ref).rsplit("/", 1)[-1].lstrip("#"))[:48] or "root"
            name, n = stem, 1
            while name in self._taken:
                n += 1
                name = f"{stem}_{n}"
            self._taken.add(name)
            self._names[id(target)] = name
            self._pending.append((name, target))
        return name


def _schema_nodes(root: Any) -> Iterator[Mapping]:
    """Every mapping in schema position under ``root`` (not inside data keywords), iteratively."""
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, is_name_map = stack.pop()
        if isinstance(node, list):
            stack.extend((item, False) for item in node)
        elif isinstance(node, Mapping):
            if is_name_map:
                stack.extend((value, False) for value in node.values())
                continue
            yield node
            stack.extend((value, key in _NAME_MAPS) for key, value in node.items()
                         if key not in _DATA_KEYWORDS and isinstance(value, (list, Mapping)))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")

