"""The bounded jinja2 sandbox for the chat template a core carries (untrusted checkpoint data).

Both renderers use it: ignition's probe renders at prepare (`helios.ignition.frontend.render`) and the
frontend's per-request `ChatTemplate` (`helios.frontend.preparation.template`); this module sits in
`core` because both may import it and the template is core data. It is the Hugging Face dialect
(trim_blocks, lstrip_blocks, loop controls, `generation` blocks) in `ImmutableSandboxedEnvironment`,
plus bounds that stop a render, with `RenderLimitExceeded` (a jinja `SecurityError`), before it
exhausts memory or CPU:

- size: `range` is refused past jinja's `MAX_RANGE` items, `lipsum` past the cap, the renderers'
  `strftime_now` (`bounded_strftime`) past `DATE_FORMAT_MAX_CHARS`; `+`, `~`, `*` and string formatting
  are checked before they build a string or list past `RenderBounds.max_chars`, integer `*` and
  `**` before they build an integer past `MAX_INT_BITS`, width arguments of the padding methods and
  filters (``center``, ``ljust``, ``indent``, ``tojson(indent=...)``, ...), `replace`, `join`, `translate`,
  ``wordwrap(wrapstring=...)`` and ``urlize(target=..., rel=...)`` before they build a string past
  the cap, and so are the filters and methods that grow every character by up to a fixed factor
  (``escape``, ``xmlattr``, ``urlencode``, ``tojson``'s escapes, case mappings) and format strings
  whose fields repeat an argument; `list` (and ``batch``, ``slice`` and ``sort``) of a string weighs
  its characters before it lists them, and `list` of any other iterable weighs its items as they
  come; `sum` joins lists in one pass, weighed first (bytes, from ``str.encode``, as strings);
  the rendered text may not exceed it either;
- time: every call (macros, methods, `caller`, recursive `loop`) and every loop counts a step,
  and every `CHECK_EVERY` steps the render's thread CPU time is compared with
  `RenderBounds.cpu_seconds`. Thread CPU time, not wall time: a render waiting for the GIL behind
  other preparation threads is not charged for it, so load cannot fail a correct template, and a
  runaway render stops on its own (nothing else can stop a Python thread).

Loops and `~` are made to count by rewriting the parsed template into calls of filters (cheaper
than the sandbox's call and operator hooks): every ``for`` iterates through `bounded_iter` (a loop
over more than `SMALL_LOOP` items, or of unknown length, counts a step per item; a smaller one
counts one, and the loops and calls nested in it count their own) and every ``~`` is
`bounded_concat`; every ``+`` is compiled with an inline check of its sum (`_CheckedSums`).

Memory held in containers is bounded too: a container literal with variable items, and a list
or tuple built by `+`, is weighed (`_text_len`) as it is built, so a chain of distinct
large values (``ns.chain = [ns.chain, ns.s ~ i]``) stops at the cap. The text of a container
(printed, ``~``, `tojson`, `join`, `string`, formatting arguments) is measured before it is built, counting shared references once per occurrence (``[s, s]`` nested
in a loop holds 2**n copies of s). What stays unbounded: one operation on values within the caps
(sorting a list of `max_chars` items) runs to its end before the next step is checked.
"""

from __future__ import annotations

import builtins
import itertools
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext
from jinja2.filters import make_attrgetter
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import generate_lorem_ipsum, pass_environment
from jinja2.visitor import NodeTransformer

MAX_INT_BITS = 1 << 16  # 19,728 decimal digits; Python's own int-to-text limit is 4,300
CHECK_EVERY = 32  # steps between two reads of the thread's CPU clock (about 0.2 us each)
SMALL_VALUE = 1 << 16  # a sum of strings this short is not checked against the cap
SMALL_LOOP = 256  # a loop over at most this many items counts one step, not one per item
ITER_FILTER, CONCAT_FILTER, BUILT_FILTER = "helios_bounded_iter", "helios_bounded_concat", "helios_weighed"
_SIZED = frozenset((list, tuple, dict, str, range))


class RenderLimitExceeded(SecurityError):
    """A render reached one of its `RenderBounds`: a value or the text too large, or its CPU time."""


@dataclass(frozen=True)
class RenderBounds:
    """The most one render may build and spend."""

    max_chars: int  # the longest string or list a render may build, and the longest rendered text
    cpu_seconds: float  # thread CPU time one render may use


class TemplateRaised(Exception):
    """`raise_exception(...)` called by a template: it rejects its input."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators=None,
            sort_keys: bool = False) -> str:
    _check_width(len(indent) if isinstance(indent, str) else indent)
    spread = 1 + (len(indent) if isinstance(indent, str) else indent if _is_int(indent) and indent > 0 else 0)
    weight = _text_len(value)
    _check_size(weight * spread, "a JSON text")
    if weight * spread * (JSON_ASCII_GROWTH if ensure_ascii else JSON_GROWTH) > _max_chars():
        _check_size((weight + _json_growth(value, bool(ensure_ascii), {})) * spread, "a JSON text")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Budget:
    __slots__ = ("max_chars", "cpu_seconds", "deadline", "steps")

    def __init__(self, bounds: RenderBounds):
        self.max_chars = bounds.max_chars
        self.cpu_seconds = bounds.cpu_seconds
        self.deadline = time.thread_time() + bounds.cpu_seconds
        self.steps = CHECK_EVERY


_current = threading.local()  # the budget of the render running on this thread


def _step() -> None:
    budget = _current.budget
    budget.steps -= 1
    if budget.steps <= 0:
        _check_clock(budget)


def _check_clock(budget: _Budget) -> None:
    budget.steps = CHECK_EVERY
    if time.thread_time() > budget.deadline:
        raise RenderLimitExceeded(f"the render used more than {budget.cpu_seconds:g} s of CPU time")


def _max_chars() -> int:
    return _current.budget.max_chars


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def _check_size(size: int, what: str) -> None:
    if size > _max_chars():
        raise RenderLimitExceeded(f"{what} of {size} items is too large")


# Width and precision of printf-style (%10.3f, %*d) and str.format-style ({:>10}, {:{w}}) specs.
_PERCENT_SPEC = re.compile(r"%[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def _check_format(spec: Any) -> None:
    """Refuses a format string whose widths could build a string past the cap."""
    if not isinstance(spec, str) or ("%" not in spec and "{" not in spec):
        return
    limit = _max_chars()
    for match in _PERCENT_SPEC.finditer(spec):
        for number in match.groups():
            if number == "*" or (number and int(number) > limit):
                raise RenderLimitExceeded(f"the format {match.group(0)!r} is too wide")
    for match in _BRACE_SPEC.finditer(spec):
        field = match.group(1)
        if "{" in field or any(int(n) > limit for n in re.findall(r"\d+", field)):
            raise RenderLimitExceeded(f"the format field {match.group(0)!r} is too wide")


def _check_arguments(values: Iterable, spec: Any = "") -> None:
    """Refuses formatting arguments whose text would pass the cap (see `_text_len`), and a format
    `spec` whose fields could print them past it: each field prints at most the longest argument,
    and a field may print the same one again (``'%s%s%s'|format(s, s, s)``, ``'{0}{0}'.format(s)``
    and ``'%(a)s%(a)s' % m`` built one copy of s per field in one call)."""
    longest = 0
    for value in values:
        if isinstance(value, (list, tuple, dict)):
            _check_size(_text_len(value), "a formatted text")
        longest = max(longest, _text_len(value) if isinstance(value, (list, tuple, dict, str)) else 0)
    if isinstance(spec, str) and longest:
        _check_size(len(spec) + max(spec.count("%"), spec.count("{")) * longest, "a formatted text")


def _check_width(width: Any) -> None:
    if _is_int(width) and width > _max_chars():
        raise RenderLimitExceeded(f"a width of {width} is too large")


LOREM_WORD_CHARS = 16  # the longest lorem ipsum word (12), a comma or full stop, a space and a margin
LOREM_PARAGRAPH_CHARS = 16  # a paragraph's own markup (<p>...</p>, or blank lines) and its full stop
URLIZE_MAX_CHARS = 1 << 20  # urlize runs its regexes on every word in one call: about 0.6 us a character


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    """jinja's `lipsum` global, refused where its paragraphs could pass the cap: one call builds
    `n` paragraphs of up to `max` words (``lipsum(200, False, 20000, 20001)`` took seconds past the
    CPU bound and built 30 MB in a single step, which no step count can stop)."""
    if _is_int(n):  # each paragraph at least its markup and a full stop, whatever `max` says (0 or less)
        words = builtins.max(max, 0) if _is_int(max) else 0
        _check_size(builtins.max(n, 0) * (words * LOREM_WORD_CHARS + LOREM_PARAGRAPH_CHARS), "a lorem ipsum text")
    return generate_lorem_ipsum(n, html, min, max)


DATE_FORMAT_MAX_CHARS = 1024  # a template formats a date with a few directives: "%d %b %Y"


def bounded_strftime(moment: datetime, format: str) -> str:  # noqa: A002 - the template's argument name
    """``moment.strftime(format)`` for a template's `strftime_now`, refused past `DATE_FORMAT_MAX_CHARS`:
    one call of CPython's strftime builds up to 256 characters per format character (a ``%c`` is 24),
    so ``strftime_now('%c' * 30000000)`` built 720 M characters in 16 s of CPU in a single step,
    which no step count can stop."""
    if isinstance(format, str) and len(format) > DATE_FORMAT_MAX_CHARS:
        raise RenderLimitExceeded(f"a date format of {len(format)} characters (at most {DATE_FORMAT_MAX_CHARS})")
    return moment.strftime(format)


def _check_replace(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    kind = text.__class__
    if kind in (str, bytes) and isinstance(old, kind) and isinstance(new, kind) and len(new) > len(old):
        found = text.count(old) if old else len(text) + 1
        if _is_int(count) and count >= 0:
            found = min(found, count)
        _check_size(len(text) + found * (len(new) - len(old)), "a replacement")


_WIDTH_METHODS = frozenset(("center", "ljust", "rjust", "zfill", "expandtabs"))


def _check_translate(text: str, table: Any) -> None:
    """`str.translate` maps each character to a string of any length: ``('x' * n).translate({120: s})``
    built n copies of s in one call. Counted only where the longest mapping could pass the cap."""
    if isinstance(table, dict):
        values, lookup = table.values(), table.get
    elif isinstance(table, (list, tuple)):
        values, lookup = table, lambda code: table[code] if code < len(table) else None
    else:
        return  # a string table maps to single characters
    longest = max((len(value) for value in values if isinstance(value, str)), default=1)
    if len(text) * longest <= _max_chars():
        return
    mapped = ((lookup(ord(char)), count) for char, count in Counter(text).items())
    _check_size(sum(count * (len(value) if isinstance(value, str) else 1) for value, count in mapped),
                "a translation")


def _check_str_method(method: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """The widths and sizes of the module docstring, for a call of a string's (or bytes') method:
    ``'x'.encode()`` is bytes, whose padding methods, `replace`, `join` and ``*`` build as strings do."""
    bound = getattr(method, "__wrapped__", method)  # the sandbox wraps str.format and format_map
    owner = getattr(bound, "__self__", None)
    if owner.__class__ is not str and owner.__class__ is not bytes:
        return
    name = bound.__name__
    if name in ("format", "format_map"):
        _check_format(owner)
        values = (*args, *kwargs.values())
        if name == "format_map" and args and isinstance(args[0], Mapping):
            values = tuple(args[0].values())
        _check_arguments(values, owner if owner.__class__ is str else owner.decode("latin-1"))
        return
    kwargs = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}  # jinja's own
    if name in _WIDTH_METHODS:
        for value in (*args, *kwargs.values()):
            _check_width(value)
        if name == "expandtabs":
            tab = "\t" if owner.__class__ is str else b"\t"
            size = owner.count(tab) * max([8, *[v for v in (*args, *kwargs.values()) if _is_int(v)]])
            _check_size(len(owner) + size, "an expansion")
    elif name == "replace":
        _check_replace(owner, *args, **kwargs)
    elif name == "join":
        items = args[0] if args else ()
        if isinstance(items, (list, tuple)):
            _check_size(sum(_sized(item) for item in items) + len(owner) * len(items), "a join")
    elif name == "translate" and args and owner.__class__ is str:
        _check_translate(owner, args[0])
    elif name in _CASE_METHODS:
        _check_case(owner)


def _check_indent(text: Any, width: Any = 4, *_: Any) -> None:
    step = width if _is_int(width) else len(width) if isinstance(width, str) else 0
    if isinstance(text, str):
        _check_size(len(text) + (text.count("\n") + 1) * step, "an indentation")


def _check_wordwrap(text: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None,
                    *_: Any, **__: Any) -> None:
    """`wordwrap` puts `wrapstring` between its lines: ``('a ' * 1000)|wordwrap(1, wrapstring=W)``
    built 1,000 copies of W in one call. Of two consecutive lines of a paragraph, the second starts
    with a word that did not fit on the first, so together they hold more than `width` characters:
    a paragraph of n characters wraps into at most 2n / (width + 1) + 1 lines."""
    if not isinstance(text, str) or not isinstance(wrapstring, str):
        return  # the environment's newline: the text at most doubles
    step = max(width, 1) if _is_int(width) else 1  # a float width: as narrow as can be
    lines = 2 * len(text) // (step + 1) + len(text.splitlines()) + 1
    _check_size(len(text) + lines * len(wrapstring), "a word wrap")


@pass_environment
def _bounded_sum(environment: Any, iterable: Iterable, attribute: Any = None, start: Any = 0) -> Any:
    """jinja's `sum`, with lists and tuples joined in one pass and weighed first: `sum` adds them
    pairwise, so n lists of total length T cost n * T (``[x] * 300|sum(start=[])``, x of 10,000
    items, took 14 s in one call, past any CPU bound, and built 3,000,000 items past the cap)."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    items = list(bounded_iter(iterable))
    if not isinstance(start, (list, tuple)) and not any(isinstance(item, (list, tuple)) for item in items):
        return sum(items, start)  # numbers (strings raise as they do in jinja)
    kind = type(start)
    if kind not in (list, tuple) or any(type(item) is not kind for item in items):
        raise TypeError(f"sum() can only join {kind.__name__} items with a {kind.__name__} start")
    _check_size(len(start) + sum(len(item) for item in items), "a sum")
    return kind(itertools.chain(start, *items))


_LINK_MARK = re.compile(r"[.:@](?=\S)")


def _check_urlize(text: Any, trim_url_limit: Any = None, nofollow: Any = False, target: Any = None,
                  rel: Any = None, *_: Any, **__: Any) -> None:
    """`urlize` writes `target` and `rel` into every link it makes: ``('http://a.com ' * 1000)|
    urlize(target=T)`` built 1,000 copies of T in one call. A link holds a dot, a colon or an @
    inside a word (followed by more of it)."""
    if isinstance(text, str) and len(text) > URLIZE_MAX_CHARS:
        raise RenderLimitExceeded(f"urlize of {len(text)} characters (at most {URLIZE_MAX_CHARS} in one call)")
    extra = sum(len(value) for value in (target, rel) if isinstance(value, str))
    if isinstance(text, str) and extra:
        links = sum(1 for _ in _LINK_MARK.finditer(text))
        _check_size(len(text) + links * extra, "a urlize")


# Case mappings write at most three characters for one (``'ŉ'.upper()`` is ``'ʼN'``, ``'ΐ'.upper()`` three).
_CASE_METHODS = frozenset(("upper", "lower", "title", "capitalize", "swapcase", "casefold"))
CASE_GROWTH = 3
# What one character of a string grows to in the filters that escape or quote it, at most: HTML
# escaping (``&#34;``), URL quoting (``%F0%9F%98%80`` for a 4-byte character), JSON (``\u0001``, and with
# ``ensure_ascii`` ``\ud83d\ude00`` for one astral character). Only where the input times its growth could
# pass the cap is the text measured exactly (the few characters that grow counted, nothing built).
ESCAPE_GROWTH, URL_GROWTH, JSON_GROWTH, JSON_ASCII_GROWTH = 5, 12, 6, 12
_HTML_ESCAPES = (("&", 4), ("<", 3), (">", 3), ('"', 4), ("'", 4))  # characters and what escaping adds
_URL_SAFE = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/"
_JSON_SHORT = re.compile(r'["\\\n\r\t\x08\x0c]')  # two characters each (\n, \\)
_JSON_CONTROL = re.compile(r"[\x00-\x07\x0b\x0e-\x1f]")  # six each (\u0001)
_JSON_WIDE = re.compile(r"[\x7f-\uffff]")  # six each with ensure_ascii (DEL too)
_JSON_ASTRAL = re.compile(r"[\U00010000-\U0010ffff]")  # twelve each with ensure_ascii (a surrogate pair)
LIST_ITEM_WEIGHT = 5  # a one-character string in a list, as `_text_len` weighs it: "'x', "


def _count(pattern: re.Pattern, text: str) -> int:
    return pattern.subn("", text)[1]  # builds at most the text again, never a list of matches


def _check_case(text: Any) -> None:
    if isinstance(text, str) and len(text) * CASE_GROWTH > _max_chars():
        _check_size(len(text) * CASE_GROWTH, "a case mapping")


def _check_escape(value: Any) -> None:
    """``escape`` (``e``, ``forceescape``) of a value: a string grows by its escaped characters, a
    container by its text's (Markup is not escaped again)."""
    if len_bound := _escape_bound(value):
        _check_size(len_bound, "an escaped text")


def _escape_bound(value: Any) -> int:
    """The length of `value` escaped, or 0 where it cannot pass the cap (measured only then)."""
    if hasattr(value, "__html__") and not isinstance(value, str):
        return 0
    if isinstance(value, (list, tuple, dict)):
        return _text_len(value) * ESCAPE_GROWTH
    if not isinstance(value, str) or len(value) * ESCAPE_GROWTH <= _max_chars():
        return 0
    return len(value) + sum(value.count(char) * extra for char, extra in _HTML_ESCAPES)


def _check_xmlattr(items: Any, *_: Any, **__: Any) -> None:
    """``xmlattr``: each item as `` key="escaped value"``."""
    if isinstance(items, dict):
        _check_size(sum(_text_len(key) + 4 + (_escape_bound(value) or _text_len(value)) for key, value in items.items()),
                    "an attribute text")


def _check_urlencode(value: Any) -> None:
    """``urlencode``: a string quoted by its UTF-8 bytes, three characters for each byte that is not
    safe; a mapping or list of pairs, each key and value so (measured by its text's weight)."""
    if isinstance(value, str):
        if len(value) * URL_GROWTH > _max_chars():
            data = value.encode("utf-8", "surrogatepass")
            _check_size(len(data) + 2 * len(data.translate(None, _URL_SAFE)), "a URL-quoted text")
    elif isinstance(value, (list, tuple, dict)):
        _check_size(_text_len(value) * URL_GROWTH, "a URL-quoted text")


def _json_growth(value: Any, ensure_ascii: bool, known: dict) -> int:
    """How many characters JSON escaping adds to the strings of `value` (keys too); containers
    walked once, counted as often as they occur (as `_weigh`)."""
    cls = value.__class__
    if cls is str:
        grown = _count(_JSON_SHORT, value) + 5 * _count(_JSON_CONTROL, value)
        if ensure_ascii:
            grown += 5 * _count(_JSON_WIDE, value) + 11 * _count(_JSON_ASTRAL, value)
        return grown
    if isinstance(value, (dict, list, tuple)):
        found = known.get(id(value))
        if found is None:
            known[id(value)] = 0
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            found = known[id(value)] = sum(_json_growth(item, ensure_ascii, known) for item in items)
        return found
    return 0


def _bounded_list(value: Any) -> list:
    """jinja's `list`, weighed as `_text_len` weighs a list: a string's characters before they are
    listed (``('😀' * 2**24)|list`` held 16 M strings of 80 bytes), other iterables (``map``,
    ``batch``, ``unique``) item by item as they come; a sized container lists the references it holds."""
    if isinstance(value, str):
        _check_size(len(value) * LIST_ITEM_WEIGHT + 2, "a list of characters")
        return list(value)
    if isinstance(value, (list, tuple, dict, range, set, frozenset)):
        return list(value)
    items, weight = [], 2
    for item in bounded_iter(value):
        weight += _text_len(item) + 2
        _check_size(weight, "a list")
        items.append(item)
    return items


def _check_groups(value: Any, size: Any, fill_with: Any = None, *, groups: Any = None) -> None:
    """``batch``/``slice`` of a string: lists of its characters (and `fill_with`), weighed as listed."""
    if isinstance(value, str) and _is_int(size) and size > 0:
        count = min(groups, len(value) + 1) if _is_int(groups) else -(-len(value) // size)
        fills = count if _is_int(groups) else size - 1  # `slice` may fill every list, `batch` its last
        fill = (_text_len(fill_with) + 2) * fills if fill_with is not None else 0
        _check_size(len(value) * LIST_ITEM_WEIGHT + 4 * count + fill + 2, "a list of characters")


def _check_filter(name: str, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """The widths and sizes of the module docstring, for the filters that can build large values."""
    if name in ("center", "batch", "slice"):
        for value in (*args[1:], *kwargs.values()):
            _check_width(value)
        if name == "batch" and len(args) >= 2:
            _check_groups(args[0], args[1], *args[2:3], **{k: v for k, v in kwargs.items() if k == "fill_with"})
        elif name == "slice" and len(args) >= 2:
            fill = args[2] if len(args) > 2 else kwargs.get("fill_with")
            _check_groups(args[0], 1, fill, groups=args[1])
    elif name in ("escape", "e", "forceescape") and args:
        _check_escape(args[0])
    elif name == "xmlattr" and args:
        _check_xmlattr(*args, **kwargs)
    elif name == "urlencode" and args:
        _check_urlencode(args[0])
    elif name in _CASE_METHODS and args:
        _check_case(args[0])
    elif name == "sort" and args and isinstance(args[0], str):
        _check_size(len(args[0]) * LIST_ITEM_WEIGHT + 2, "a list of characters")
    elif name == "indent" and args:
        _check_indent(*args[:2], **{k: v for k, v in kwargs.items() if k == "width"})
    elif name == "format" and args:
        _check_format(args[0])
        _check_arguments((*args[1:], *kwargs.values()), args[0])
    elif name == "replace" and len(args) >= 3:
        _check_replace(*args[:3])
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        separator = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        _check_size(_text_len(args[0]) + len(separator) * len(args[0]), "a join")
    elif name in ("string", "pprint") and args:
        text_of(args[0])
    elif name == "wordwrap" and args:
        _check_wordwrap(*args, **kwargs)
    elif name == "urlize" and args:
        _check_urlize(*args, **kwargs)


_GROWING_FILTERS = frozenset(("center", "batch", "slice", "indent", "format", "replace", "join", "string",
                              "pprint", "wordwrap", "urlize", "escape", "e", "forceescape", "xmlattr", "urlencode",
                              "upper", "lower", "title", "capitalize", "sort"))


def _bounded_filter(name: str, function: Any) -> Any:
    """`function` with `_check_filter` applied to its own arguments first."""
    skip = 1 if hasattr(function, "jinja_pass_arg") else 0  # the context or environment jinja passes

    def bounded(*args, **kwargs):
        _check_filter(name, args[skip:], kwargs)
        return function(*args, **kwargs)

    for attribute in ("jinja_pass_arg", "__name__", "__doc__"):
        if hasattr(function, attribute):
            setattr(bounded, attribute, getattr(function, attribute))
    return bounded


class _CountLoops(NodeTransformer):
    """Routes every `for` through `bounded_iter` and every `~` through `bounded_concat`, as filters
    (a filter is called directly; a call would pass through `BoundedSandbox.call`)."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, ITER_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_List(self, node: nodes.List) -> nodes.Expr:
        return self._weighed(self.generic_visit(node))

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        return self._weighed(self.generic_visit(node)) if node.ctx == "load" else node

    def visit_Dict(self, node: nodes.Dict) -> nodes.Expr:
        return self._weighed(self.generic_visit(node))

    @staticmethod
    def _weighed(node: nodes.Expr) -> nodes.Expr:
        """A container literal of variable items (``[ns.s, ns.chain]`` in a loop holds ever more
        distinct large values) is weighed as it is built; a constant one needs no check."""
        try:
            node.as_const()
            return node
        except nodes.Impossible:
            return nodes.Filter(node, BUILT_FILTER, [], [], None, None, lineno=node.lineno)

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        node = self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(parts, CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


def bounded_iter(iterable: Iterable) -> Iterable:
    """One step for the loop; an iterable of more than `SMALL_LOOP` items (or of unknown length)
    counts one more step per item."""
    _step()
    if iterable.__class__ in _SIZED and len(iterable) <= SMALL_LOOP:
        return iterable
    return _counted(iterable)


def _counted(iterable: Iterable) -> Iterator:
    for item in iterable:
        _step()
        yield item


def bounded_range(*args: int) -> range:
    """`range`, refused past jinja's sandbox limit (`MAX_RANGE` items) with the typed error."""
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise RenderLimitExceeded(f"a range of {len(numbers)} items is too large (at most {MAX_RANGE})")
    return numbers


def _text_len(value: Any) -> int:
    """About how many characters `str(value)` (or its JSON) has, without building it: a container
    whose items are shared references (``[x, x]`` nested n deep holds 2**n copies of x) is walked
    once and counted as often as it occurs."""
    return _weigh(value, {})


def _weigh(item: Any, known: dict) -> int:
    cls = item.__class__
    if cls is str:
        return len(item) + 2
    if cls is dict or cls is list or cls is tuple:
        found = known.get(id(item))
        if found is None:
            known[id(item)] = 0  # a cycle (the sandbox cannot build one) would count nothing
            total = 2
            if cls is dict:
                for key, entry in item.items():
                    total += _weigh(key, known) + _weigh(entry, known) + 2
            else:
                for entry in item:
                    total += _weigh(entry, known) + 2
            found = known[id(item)] = total
        return found
    if cls is int or cls is float or cls is bool or item is None:
        return 8
    return _weigh(list(item.items()), known) if isinstance(item, dict) else len(str(item))


def text_of(value: Any) -> str:
    """`str(value)`, refused when a container's text would pass the cap."""
    if isinstance(value, (list, tuple, dict)):
        _check_size(_text_len(value), "the text of a container")
    return str(value)


class _CheckedSums(CodeGenerator):
    """Compiles `a + b` to an inline check of the sum, cheaper than a call: a sum that is not a
    string of at most `SMALL_VALUE` characters (the common case) goes to `checked_sum`. (Built
    first, so a sum of two values within the cap may reach twice the cap before it is refused.)
    Output (``{{ value }}``) that is not a string goes through `text_of` instead of `str`."""

    @optimizeconst
    def visit_Add(self, node: nodes.Add, frame) -> None:
        self.write("(_sum if (_sum := (")
        self.visit(node.left, frame)
        self.write(" + ")
        self.visit(node.right, frame)
        self.write(f")).__class__ is str and len(_sum) <= {SMALL_VALUE} else environment.checked_sum(_sum))")

    def _output_child_pre(self, node: nodes.Expr, frame, finalize) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape or finalize.src is not None:
            return super()._output_child_pre(node, frame, finalize)  # not the sandbox's settings
        self.write("(_out if (_out := (")

    def _output_child_post(self, node: nodes.Expr, frame, finalize) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape or finalize.src is not None:
            return super()._output_child_post(node, frame, finalize)
        self.write(")).__class__ is str else environment.text_of(_out))")


def checked_sum(value: Any) -> Any:
    _check_size(_text_len(value) if isinstance(value, (list, tuple)) else _sized(value), "a concatenation")
    return value


def weighed(container: Any) -> Any:
    _check_size(_text_len(container), "a container")
    return container


def bounded_concat(values: tuple) -> str:
    texts = [value if value.__class__ is str else text_of(value) for value in values]
    _check_size(sum(map(len, texts)), "a concatenation")
    return "".join(texts)


class GenerationBlocks(Extension):
    """``{% generation %}...{% endgeneration %}``: the tag `transformers` adds to the dialect to mark
    the assistant's own text (its `return_assistant_tokens_mask`); a render prints the body as it
    stands, as `apply_chat_template` does. Published templates carry it (trained for assistant-only
    loss), and without the tag they did not compile at all. Parsed as transformers parses it (a call
    block, so the body is a scope of its own, and its call counts a step)."""

    tags = {"generation"}

    def parse(self, parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_body"), [], [], body).set_lineno(lineno)

    def _generation_body(self, caller) -> str:
        return caller()


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The chat-template environment with the bounds of the module docstring, `tojson`
    (``ensure_ascii=False``, as `transformers` has it) and `raise_exception` (`TemplateRaised`);
    the renderer adds `strftime_now`. Templates from it render only through `render_bounded`,
    which installs the render's budget."""

    intercepted_binops = frozenset(("*", "**", "%"))  # `+` is compiled with its check inline
    code_generator_class = _CheckedSums
    text_of = staticmethod(text_of)
    checked_sum = staticmethod(checked_sum)

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlocks, loopcontrols])
        self.filters = {**self.filters, **{name: _bounded_filter(name, self.filters[name])
                                           for name in _GROWING_FILTERS if name in self.filters}}
        self.filters["tojson"] = _tojson
        self.filters["sum"] = _bounded_sum
        self.filters["list"] = _bounded_list
        self.filters[ITER_FILTER] = bounded_iter
        self.filters[CONCAT_FILTER] = bounded_concat
        self.filters[BUILT_FILTER] = weighed
        self.globals["raise_exception"] = _raise_exception
        self.globals["range"] = bounded_range
        self.globals["lipsum"] = _bounded_lipsum

    def _parse(self, source, name, filename):
        return _CountLoops().visit(super()._parse(source, name, filename))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
        budget = _current.budget
        budget.steps -= 1
        if budget.steps <= 0:
            _check_clock(budget)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (bounded_iter(args[0]), *args[1:])
        else:
            _check_str_method(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            if _is_int(left) and _is_int(right):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise RenderLimitExceeded("an integer product is too large")
            else:
                # a repeated list holds n references, not n values: its text is weighed where it is built
                _check_size(max(_sized(left) * right if _is_int(right) else 0,
                                _sized(right) * left if _is_int(left) else 0), "a repetition")
        elif operator == "**":
            if _is_int(left) and _is_int(right) and abs(left) > 1 and right * abs(left).bit_length() > MAX_INT_BITS:
                raise RenderLimitExceeded(f"the power {left} ** {right} is too large")
        elif operator == "%" and isinstance(left, (str, bytes)):
            spec = left if isinstance(left, str) else left.decode("latin-1")
            _check_format(spec)
            values = right if isinstance(right, tuple) else (right, *right.values()) if isinstance(right, dict) else (right,)
            _check_arguments(values, spec)
        return self.binop_table[operator](left, right)


def render_bounded(template, variables: Mapping[str, Any], bounds: RenderBounds) -> str:
    """`template` (from a `BoundedSandbox`) rendered with `variables` within `bounds`.

    Raises `RenderLimitExceeded` at a bound, or what the template itself raises.
    """
    previous = getattr(_current, "budget", None)
    _current.budget = _Budget(bounds)
    try:
        chunks, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > bounds.max_chars:
                raise RenderLimitExceeded(f"the rendered text exceeds {bounds.max_chars} characters")
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        _current.budget = previous
