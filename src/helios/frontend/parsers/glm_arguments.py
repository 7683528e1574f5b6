"""GLM argument tags (`ToolSyntaxKind.GLM_ARGUMENTS`)::

    <tool_call>NAME
    <arg_key>K</arg_key>
    <arg_value>V</arg_value>
    </tool_call>

The name is the text after the opener, up to ``name_separator`` (or the first key, or the closer
of a call without arguments), surrounding whitespace removed; so is a key's (``<arg_key> city
</arg_key>`` is ``city``, as vLLM's GLM parser reads it), which is any text without ``<`` (line
breaks and quotes too). One block is one call; parallel calls are
consecutive blocks. Values are typed by the request's JSON schema; a string value is the text as
written (the template writes it so). Recovery rules: `tag_tools`.
"""

from __future__ import annotations

from helios.frontend.parsers.scan import FORBIDDEN_IN_TEXT, TagForm
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.decoding.syntax import GlmArgumentSyntax


def glm_arguments_grammar(syntax: GlmArgumentSyntax) -> ToolGrammar:
    return ToolGrammar(
        block_open=syntax.block_open,
        block_close=syntax.block_close,
        invoke_open=None,
        invoke_close="",
        name_separator=syntax.name_separator,
        # the key is text, as written: vLLM's GLM parser reads any text up to </arg_key> (a key the
        # model wrote on its own line, "<arg_key>\ncity\n</arg_key>", was no tag, so the argument was lost)
        key_open=TagForm(syntax.key_open, (syntax.key_close,), FORBIDDEN_IN_TEXT),
        value_open=syntax.value_open,
        value_close=syntax.value_close,
        block_lead=syntax.block_lead,
        key_is_text=True,
    )
