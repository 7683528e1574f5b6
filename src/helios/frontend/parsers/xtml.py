"""XTML: an XML-tagged output syntax with its think element (`ReasoningSyntaxKind.XTML_THINK`
with `ToolSyntaxKind.XTML`). Definition, with the example spellings::

    output     := [think] answer-text* (calls answer-text*)*
    think      := "<xtml:think>" [NL] etext [NL] ("</xtml:think>" [NL] | terminal)
    terminal   := the calls opener "<xtml:calls>", which ends reasoning and opens a calls block
    calls      := "<xtml:calls>" (WS call)+ WS "</xtml:calls>"
    call       := '<xtml:call name="' NAME '">' (WS arg)* WS "</xtml:call>"
    arg        := '<xtml:arg name="' KEY '">' etext "</xtml:arg>"
    etext      := text where "&", "<" and ">" are written "&amp;", "&lt;", "&gt;" ("&quot;",
                  "&apos;" and numeric references "&#N;" / "&#xH;" are decoded too; other "&"
                  sequences stay literal)

Inside the think element and argument values, text is XML-escaped, so a literal closer can never
appear there; answer text outside elements is plain. Argument values, once unescaped, are typed by
the request's JSON schema like Qwen Coder values (strings verbatim, scalars from their spelling,
objects and arrays as JSON). NAME and KEY contain no ``<>"`` or newline. NL is the syntax's
wrapping text (``after_open``/``before_close``/``after_close``), WS any whitespace.

XTML think requires XTML tools because its terminal marker is the XTML calls opener and both use
the same escaping. Single-token delimiters follow the think-tag rules (`think_tags`); recovery
follows `tag_tools`. Since etext holds no literal ``<``, an argument or call closer, or the next
argument tag, inside an argument's value ends the value whose ``</xtml:arg>`` was left out
(``unclosed_value_ends``; XTML has no value wrap, so anywhere in the value).
"""

from __future__ import annotations

from helios.frontend.parsers.calls import ValueFormat
from helios.frontend.parsers.delimiters import TokenDelimiters
from helios.frontend.parsers.scan import TagForm
from helios.frontend.parsers.start import ReasoningState
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.parsers.think_tags import ThinkTagParser
from helios.frontend.decoding.syntax import ElementToolSyntax, ThinkSyntax


def xtml_grammar(syntax: ElementToolSyntax) -> ToolGrammar:
    return ToolGrammar(
        block_open=syntax.block_open,
        block_close=syntax.block_close,
        invoke_open=TagForm(syntax.invoke_open, (syntax.attribute_end,)),
        invoke_close=syntax.invoke_close,
        key_open=TagForm(syntax.parameter_open, (syntax.attribute_end,)),
        value_close=syntax.parameter_close,
        value_format=ValueFormat.XML_ESCAPED,
        block_lead=syntax.block_lead,
        unclosed_value_ends=True,  # etext holds no "<": a tag in a value can only follow a left-out closer
    )


def xtml_think_parser(syntax: ThinkSyntax, delimiters: TokenDelimiters, start: ReasoningState) -> ThinkTagParser:
    return ThinkTagParser(syntax, delimiters, start, escaped=True)
