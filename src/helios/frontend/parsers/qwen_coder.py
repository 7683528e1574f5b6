"""Qwen Coder function tags (`ToolSyntaxKind.QWEN_CODER_FUNCTIONS`)::

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

One block usually holds one function; parallel calls are consecutive blocks (several functions in
one block are accepted too). ``value_wrap`` (a newline) is removed from both ends of each value;
values are typed by the request's JSON schema for the parameter. A value whose ``</parameter>`` was
left out ends at the next parameter tag or the function closer on a new line, as Qwen's and vLLM's
parsers read it (``unclosed_value_ends``). A function written without the block around it
(``<function=NAME>...</function>`` at the start of a line of answer text) is a call of a registered
tool, as vLLM's parser reads it (``bare_invocations``). A parameter name is the text up to the tag's ``>``, quotes
and line breaks included, as vLLM's qwen3_coder parser reads it (the template writes the name
verbatim); a name holding ``<`` or ``>`` cannot be read back (the ``>`` would end it short).
Recovery rules: `tag_tools`.
"""

from __future__ import annotations

from helios.frontend.parsers.scan import FORBIDDEN_IN_TAG_TEXT, TagForm
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.decoding.syntax import QwenCoderSyntax


def qwen_coder_grammar(syntax: QwenCoderSyntax) -> ToolGrammar:
    return ToolGrammar(
        block_open=syntax.block_open,
        block_close=syntax.block_close,
        invoke_open=TagForm(syntax.function_open, (syntax.tag_end,)),
        invoke_close=syntax.function_close,
        # the name is any text up to ">" (a quote or a line break in it made the parameter unwritable, a 400)
        key_open=TagForm(syntax.parameter_open, (syntax.tag_end,), FORBIDDEN_IN_TAG_TEXT),
        value_close=syntax.parameter_close,
        value_wrap=syntax.value_wrap,
        block_lead=syntax.block_lead,
        unclosed_value_ends=True,
        bare_invocations=True,
    )
