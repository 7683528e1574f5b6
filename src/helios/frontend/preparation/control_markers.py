"""Control markers in client text stay text: no special-token injection through a chat prompt.

A chat prompt is the chat template rendered over client strings (message content and text parts,
names, reasoning, tool-call ids, names and arguments, tool schemas, chat_template_kwargs values),
and `tokenizers` matches added tokens anywhere in the text it encodes. Left alone, a user message
holding ``<|im_end|>\\n<|im_start|>system\\n...`` would become real control tokens: a forged system
turn, tool result or end of turn. Here a marker the template emits stays a control token, and a
marker inside client text is tokenized as its literal text, the pieces any other text gets (what
``encode_special_tokens=True`` does for special tokens), as OpenAI's API treats client text as text.

Markers are the tokenizer's added tokens that are special, or that carry markup (a character that
is neither alphanumeric nor whitespace). So non-special markup tokens count: DeepSeek V3's turn and
tool-call frames (``<｜User｜>``, ``<｜Assistant｜>``, ``<｜tool▁call▁begin｜>`` ...) are non-special
added tokens, like Qwen's ``<tool_call>``, ``<tool_response>`` and ``<think>``, and a client forging
them forges structure just the same; `special` only says what decoding may skip. Added tokens that
are plain words or runs of whitespace are vocabulary and stay tokens wherever they occur.

How:

- `escape_inputs` first scans every client string at once (joined by NULs, which no marker holds):
  per character that starts a marker, one substring test, and where it occurs a compiled trie
  search and a look at the characters before each string's end. A request none of whose strings
  holds a marker or ends in a proper prefix of one keeps its very objects: it renders and
  tokenizes exactly as before, with the plain tokenizer.
- Otherwise the first character of every marker occurrence, and of a trailing marker prefix (which
  the next string or the template's text could complete), is replaced by its twin: a Unicode
  noncharacter (U+FDD0 on) that no marker holds. No added token can match across a twin, whatever
  the template does with the string (slices, trims, case changes, JSON, concatenation); a template
  that drops one drops text, and one that escapes it (``tojson`` with ``ensure_ascii``) renders the
  escape as text, so a twin that goes missing can never become a marker, and nothing is refused.
- `encode` tokenizes a rendered text holding twins with the literal encoder: a `Tokenizer` sharing
  the model, pre-tokenizer and added tokens (markers matched on the raw text), whose normalizer
  first turns each twin back into its character. `tokenizers` splits on added tokens before it
  normalizes, so the template's markers are control tokens and each restored marker is tokenized
  with the text around it; `restore` gives the prompt text those ids decode to. Added tokens keep
  lstrip/rstrip: a template marker strips the whitespace beside it as before, client whitespace
  included; a client marker is text and strips nothing.

A template that looks for a marker in client text (Qwen3 splits assistant content at ``</think>``)
no longer finds one there: client text is text. A request that needs twins and also holds a twin
character itself is refused (`MarkerTextError`, 400): the literal encoder would turn that character
into a marker's first character. Not covered: a marker the template assembles from its own literal
pieces around client text (``'<' + name + '>'``) or derives from it (``replace``, ``lower``); no
template we know does.

`/v1/completions` is another matter: its raw ``prompt`` is the whole text the client means the model
to read, markers included, so it is tokenized with the plain tokenizer and its markers are control
tokens. `stop` strings are matched against output text and `logit_bias` names ids: neither is
tokenized as a prompt, so neither changes here.

`ControlMarkers` is immutable and safe to use from several preparation workers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, NamedTuple

from tokenizers import AddedToken, Tokenizer, normalizers
from tokenizers.models import WordLevel

from helios.errors import RequestError
from helios.frontend.preparation.messages import ToolArguments, json_text


class MarkerTextError(RequestError):
    """Client text holds one of the characters reserved for keeping marker text literal."""


@dataclass(frozen=True)
class TemplateInputs:
    """What the template renders; `is_escaped` when some client string holds a twin."""

    messages: list
    tools: list | None
    kwargs: Mapping[str, object] | None
    is_escaped: bool = False


class _EscapedArguments(ToolArguments):
    """Tool-call arguments whose text and decoded object were escaped separately."""

    def __init__(self, text: str, value: dict):
        dict.__init__(self, value)  # not ToolArguments.__init__: the text may decode to other strings
        self._text = text


def _strings(value) -> Iterator[str]:
    """Every string in template inputs: keys and values, and the text of tool-call arguments."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from (key for key in item if isinstance(key, str))
            stack.extend(item.values())
            if isinstance(item, ToolArguments):
                yield json_text(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def is_marker(token: AddedToken) -> bool:
    """Special, or markup; whitespace runs and plain words are vocabulary (see the module docstring)."""
    text = token.content
    if not text.strip():
        return False
    return token.special or any(not (c.isalnum() or c.isspace()) for c in text)


def _noncharacters() -> Iterator[str]:
    yield from map(chr, range(0xFDD0, 0xFDF0))
    for plane in range(17):
        yield chr(plane * 0x10000 + 0xFFFE)
        yield chr(plane * 0x10000 + 0xFFFF)
    yield from map(chr, range(0x100000, 0x10FFFE))  # private use, past the 66 noncharacters


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching any of `words`, as a trie, so a search costs one branch per character."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body  # the longer marker first

    return emit(trie)


class _FirstChar(NamedTuple):
    """The markers that start with one character: their trie, and a string end a proper prefix away."""

    char: str
    markers: re.Pattern
    ends: re.Pattern  # the character, then a string's end (a NUL in the joined scan) within reach


class ControlMarkers:
    """The control markers of one tokenizer and the literal encoder for client text (immutable)."""

    def __init__(self, markers: Iterable[str], tokenizer: Tokenizer, literal: Tokenizer, twins: Mapping[str, str]):
        """`twins` maps each marker's first character to its twin; `literal` restores twins first."""
        markers = sorted(set(markers))
        if any("\0" in marker for marker in markers) or set(twins) != {marker[0] for marker in markers}:
            raise ValueError("markers hold no NUL, and each first character has one twin")
        self._tokenizer = tokenizer
        self._literal = literal
        self._twin_of = dict(twins)
        self._restore = tuple((twin, char) for char, twin in self._twin_of.items())
        self._prefixes = frozenset(m[:i] for m in markers for i in range(1, len(m)))
        self._max_len = max(map(len, markers), default=0)
        reach = max(self._max_len - 2, 0)
        self._firsts = tuple(
            _FirstChar(char, re.compile(_trie_pattern(m for m in markers if m[0] == char)),
                       re.compile(f"{re.escape(char)}[^\\0]{{0,{reach}}}+\\0"))
            for char in sorted(self._twin_of)
        )  # a trie each: a search skips to the character as a literal, a shared trie would not
        self._markers = re.compile(_trie_pattern(markers)) if markers else None
        self._twins = re.compile("[" + "".join(map(re.escape, self._twin_of.values())) + "]")

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ControlMarkers:
        added = sorted(tokenizer.get_added_tokens_decoder().items())
        markers = [token.content for _, token in added if is_marker(token) and "\0" not in token.content]
        if not markers:
            return cls((), tokenizer, tokenizer, {})
        firsts = sorted({marker[0] for marker in markers})
        spare = (c for c in _noncharacters() if not any(c in marker for marker in markers))
        twins = dict(zip(firsts, spare))
        return cls(markers, tokenizer, literal_encoder(tokenizer, twins), twins)

    def escape_inputs(self, messages: list, tools: list | None, kwargs: Mapping[str, object] | None) -> TemplateInputs:
        """Template inputs with client markers twinned; the same objects where nothing needed it.

        Raises `MarkerTextError` when the request needs twins and also holds a twin character."""
        if self._markers is None or not self._needs_escape([messages, tools, kwargs]):
            return TemplateInputs(messages, tools, kwargs)
        escaped = TemplateInputs(
            [self._escape(message) for message in messages],
            self._escape(tools),
            {k: self._escape(v) for k, v in kwargs.items()} if isinstance(kwargs, Mapping) else kwargs,
            True,
        )  # kwargs that are no mapping are the template's 400 to give
        if (all(a is b for a, b in zip(escaped.messages, messages)) and escaped.tools is tools
                and (escaped.kwargs is kwargs or all(escaped.kwargs[k] is v for k, v in kwargs.items()))):
            return TemplateInputs(messages, tools, kwargs)  # the scan's NUL ends were inside a string
        fields = [*(f"messages[{i}]" for i in range(len(messages))), "tools", "chat_template_kwargs"]
        for where, value in zip(fields, [*messages, tools, kwargs]):
            if (twin := self._twins.search("\0".join(_strings(value)))) is not None:
                raise MarkerTextError(
                    f"{where} holds U+{ord(twin.group()):04X}, a character this server reserves for keeping "
                    "control-token text (such as a chat template's turn markers) literal in prompts; it cannot come "
                    "in one request with such text", where.partition("[")[0])
        return escaped

    def _needs_escape(self, value) -> bool:
        """Whether some string holds a marker or ends in a proper prefix of one: one scan per first
        character over all the strings joined by NULs (no marker holds one), so a NUL ends a string."""
        joined = "\0".join(_strings(value)) + "\0"
        for first in self._firsts:
            if first.char not in joined:
                continue
            if first.markers.search(joined) is not None:
                return True
            if any(self._ends_in_prefix(found.group()[:-1]) for found in first.ends.finditer(joined)):
                return True
        return False

    def _ends_in_prefix(self, text: str) -> bool:
        return any(text[i:] in self._prefixes for i, char in enumerate(text) if char in self._twin_of)

    def _escape(self, value):
        """`value` with every string (keys included) escaped; a container is the same object where
        nothing in it changed. Iterative: tool-call arguments nest as deep as JSON decoding allows,
        deeper than Python's recursion limit leaves room for (a recursion here was a 500)."""
        done: list = []  # escaped values of visited nodes, children in order before their container
        stack: list = [(value, None)]  # (node, None): visit it; (container, n): build it from n results
        while stack:
            node, count = stack.pop()
            if count is not None:
                children = done[len(done) - count:]
                del done[len(done) - count:]
                done.append(self._rebuilt(node, children))
            elif isinstance(node, str):
                done.append(self._escape_text(node))
            elif isinstance(node, (dict, list)):
                children = [part for pair in node.items() for part in pair] if isinstance(node, dict) else node
                stack.append((node, len(children)))
                stack.extend((child, None) for child in reversed(children))
            else:
                done.append(node)
        return done[0]

    def _rebuilt(self, node: dict | list, children: list):
        """`node` with its escaped children (a dict's keys and values alternating)."""
        if isinstance(node, list):
            return node if all(a is b for a, b in zip(children, node)) else children
        pairs = list(zip(children[::2], children[1::2]))
        unchanged = all(k2 is k and v2 is v for (k2, v2), (k, v) in zip(pairs, node.items()))
        items = node if unchanged else dict(pairs)
        if isinstance(node, ToolArguments):
            original = json_text(node)
            text = self._escape_text(original)
            return node if text is original and items is node else _EscapedArguments(text, items)
        return items

    def _escape_text(self, text: str) -> str:
        """The text with the first character of each marker, and of a trailing proper prefix of one,
        twinned; the same object when it holds neither."""
        escaped = text
        while starts := [match.start() for match in self._markers.finditer(escaped)]:
            escaped = self._twin_at(escaped, starts)  # again: a marker may overlap the one twinned
        tail_from = max(0, len(escaped) - self._max_len + 1)
        escaped = self._twin_at(escaped, [i for i in range(tail_from, len(escaped)) if escaped[i:] in self._prefixes])
        return text if escaped == text else escaped

    def _twin_at(self, text: str, positions: list[int]) -> str:
        if not positions:
            return text
        chars = list(text)
        for i in positions:
            chars[i] = self._twin_of[chars[i]]
        return "".join(chars)

    def restore(self, text: str) -> str:
        """The text with each twin turned back into its character (what the prompt ids decode to)."""
        for twin, char in self._restore:
            text = text.replace(twin, char)  # far faster than str.translate for characters past ASCII
        return text

    def encode(self, rendered: str, is_escaped: bool) -> tuple[str, tuple[int, ...]]:
        """(prompt text, token ids) of a rendered text; a text holding twins is restored, its markers
        tokenized as text. Without `is_escaped` this is the plain tokenizer, with no extra scan."""
        if is_escaped and self._twins.search(rendered) is not None:  # a prefix render may hold none
            return self.restore(rendered), tuple(self._literal.encode(rendered, add_special_tokens=False).ids)
        return rendered, tuple(self._tokenizer.encode(rendered, add_special_tokens=False).ids)


def literal_encoder(tokenizer: Tokenizer, twins: Mapping[str, str]) -> Tokenizer:
    """A tokenizer sharing `tokenizer`'s model and pre-tokenizer, with the same added tokens at the same
    ids (lstrip, rstrip and single_word kept), whose normalizer first turns each twin back into its
    character. Markers are matched on the raw text, before that normalizer, so a restored one is text;
    for the tokenizers served here that is where they matched anyway (no normalizer, or markers not
    normalized)."""
    added = sorted(tokenizer.get_added_tokens_decoder().items())
    vocab = {token.content: token_id for token_id, token in added}
    literal = Tokenizer(WordLevel(vocab, unk_token=added[0][1].content))
    literal.add_tokens([
        AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                   normalized=t.normalized and not is_marker(t), special=t.special)
        for _, t in added
    ])  # ids come from the placeholder vocabulary above, so they equal the tokenizer's own
    literal.model = tokenizer.model
    restores = [normalizers.Replace(twin, char) for char, twin in twins.items()]
    original = tokenizer.normalizer
    literal.normalizer = normalizers.Sequence(restores + ([original] if original is not None else []))
    if tokenizer.pre_tokenizer is not None:
        literal.pre_tokenizer = tokenizer.pre_tokenizer
    return literal
