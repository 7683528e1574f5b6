"""ATEM function-call blocks, the body of recipient-header tool frames (`ToolSyntaxKind.ATEM_RECIPIENTS`)::

    <atem:function_calls>
    <atem:invoke name="NAME">
    <atem:parameter name="K">VALUE</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

Exactly one invocation per frame: a second one (in the same or another block of the frame) is
`EXTRA_INVOCATION` and dropped; parallel calls use consecutive frames. VALUE is raw text typed by
the request's JSON schema for the parameter: scalars (integer, number, boolean, null) from their
literal spelling, objects and arrays as JSON, strings verbatim. Text outside the block is
`UNEXPECTED_TEXT`; nothing in a tool frame becomes visible content. The frame parser
(`recipient_frames`) supplies the name rule: the generic tool recipient accepts any registered
name, a named tool recipient exactly its own.
"""

from __future__ import annotations

from helios.frontend.parsers.scan import TagForm
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.decoding.syntax import ElementToolSyntax


def atem_grammar(syntax: ElementToolSyntax) -> ToolGrammar:
    return ToolGrammar(
        block_open=syntax.block_open,
        block_close=syntax.block_close,
        invoke_open=TagForm(syntax.invoke_open, (syntax.attribute_end,)),
        invoke_close=syntax.invoke_close,
        key_open=TagForm(syntax.parameter_open, (syntax.attribute_end,)),
        value_close=syntax.parameter_close,
        max_invocations=1,
    )
