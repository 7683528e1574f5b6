"""Compiled tool syntax (`ToolGrammar`) and the per-parser policies of `tag_tools.TagToolParser`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from helios.frontend.decoding.events import ParseError, ParseErrorKind
from helios.frontend.parsers.calls import ValueFormat
from helios.frontend.parsers.scan import TagForm
from helios.frontend.parsers.values import ToolRegistry


@dataclass(frozen=True)
class ToolGrammar:
    """Compiled spellings of one tag tool syntax (built by the family modules).

    ``invoke_open`` None: the name is text right after ``block_open`` ended by ``name_separator``.
    ``invoke_close`` "": the block closer ends the invocation. ``value_open`` "": the key tag opens
    the value. ``string_flag`` (true, false): the key tag captures a flag after the key.
    ``max_invocations`` 0: unlimited. ``unclosed_value_ends``: a tag that may follow a value (a key,
    the invocation or block closer) right after ``value_wrap`` inside a value ends the value whose
    closer was left out (see `tag_tools`). ``key_is_text``: the key is the text between its open and
    close tags (GLM), read without surrounding whitespace as the inline name is (vLLM's GLM parser
    strips it too); a key captured inside a tag (``<parameter=K>``, ``name="K"``) is read as written.
    ``bare_invocations``: an invocation tag of a registered tool at the start of a line of answer
    text, written without the block opener, opens a call that its invocation closer ends (Qwen Coder:
    vLLM's qwen3_coder parser reads ``<function=NAME>...</function>`` without ``<tool_call>`` as a
    call; another name's tag, or one mid-line, stays answer text).
    """

    block_open: str
    block_close: str
    invoke_open: TagForm | None
    invoke_close: str
    key_open: TagForm
    value_close: str
    value_open: str = ""
    name_separator: str = ""
    string_flag: tuple[str, str] | None = None
    value_wrap: str = ""
    value_format: ValueFormat = ValueFormat.RAW
    block_lead: str = ""
    max_invocations: int = 0
    unclosed_value_ends: bool = False
    key_is_text: bool = False
    bare_invocations: bool = False

    def value_end_tags(self) -> dict[str, TagForm]:
        """The tags that end a value whose closer was left out (``unclosed_value_ends``; none
        otherwise), by the parser state label they are read as: those that may follow a value,
        spelled after the value wrap, since the template writes the wrap before the closer the model
        left out (a wrap-led tag inside a written value is rare; one elsewhere stays value text). A
        grammar-written value never spells one's leading text (`grammar_values`): the parser would
        cut the value there."""
        if not self.unclosed_value_ends:
            return {}
        wrap = self.value_wrap
        key = self.key_open
        tags = {"key": TagForm(wrap + key.prefix, key.terminators, key.forbidden),
                "end": TagForm(wrap + (self.invoke_close or self.block_close))}
        if self.invoke_close:
            tags["close"] = TagForm(wrap + self.block_close)
        return tags


class StrayText(enum.Enum):
    CONTENT = "content"  # the parser reads answer text: raw markup becomes content
    ERROR = "error"  # the parser reads a tool frame: nothing becomes content


@dataclass(frozen=True)
class NameRule:
    """Accepted invocation names: registered ones, or exactly ``required`` when it is set."""

    registry: ToolRegistry
    required: str = ""

    def check(self, name: str) -> ParseError | None:
        if self.required and name != self.required:
            return ParseError(ParseErrorKind.RECIPIENT_MISMATCH, f"{self.required} != {name}")
        if not self.registry.has(name):
            return ParseError(ParseErrorKind.UNKNOWN_TOOL, name)
        return None
