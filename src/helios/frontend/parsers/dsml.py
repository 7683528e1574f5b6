"""DSML tool syntax (`ToolSyntaxKind.DSML`), as DeepSeek models write it::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="N" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

One block holds one or more invocations (parallel calls). The ``string`` flag types each value:
``true`` keeps the text verbatim, ``false`` parses it as JSON (kept as a string with
`INVALID_VALUE` when it is not JSON). Recovery rules: `tag_tools`.
"""

from __future__ import annotations

from helios.frontend.parsers.scan import TagForm
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.decoding.syntax import ElementToolSyntax


def dsml_grammar(syntax: ElementToolSyntax) -> ToolGrammar:
    return ToolGrammar(
        block_open=syntax.block_open,
        block_close=syntax.block_close,
        invoke_open=TagForm(syntax.invoke_open, (syntax.attribute_end,)),
        invoke_close=syntax.invoke_close,
        key_open=TagForm(syntax.parameter_open, (syntax.string_attribute, syntax.attribute_end)),
        value_close=syntax.parameter_close,
        string_flag=(syntax.string_true, syntax.string_false),
        block_lead=syntax.block_lead,
    )
