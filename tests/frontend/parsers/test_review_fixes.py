"""Two regressions of the commit that let a block opener in prose open a block, and read whole-number
floats as integers.

An example call quoted inside a rejected invocation (an unknown tool's argument, a named recipient's
mismatch) ran as a real call and its text left the content: the block opener now opened a block in
any rejected block, not only in one rejected for text before its first invocation (the prose case).
As before that commit, a rejected invocation's text up to the block closer is raw, the quoted call
too. An integer parameter written ``9007199254740993.0`` was read through a float, rounded to
9007199254740992 and reported valid; it is read exactly.
"""

from __future__ import annotations

import pytest

from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.parsers.values import ValueKind, typed_value

from .test_opener_in_prose import parse

DS = "｜DSML｜"
QUOTED = {  # (family, an unknown (or mismatched) invocation whose argument quotes a get_time call, its error)
    "qwen-coder": ("qwen-coder",
                   "<tool_call>\n<function=unknown_tool>\n<parameter=code>\nexample: <tool_call>\n<function=get_time>\n"
                   "</function>\n</tool_call>\n</parameter>\n</function>\n</tool_call>", K.UNKNOWN_TOOL),
    "glm": ("glm",
            "<tool_call>unknown_tool\n<arg_key>code</arg_key>\n<arg_value>example: <tool_call>get_time\n</tool_call>"
            "</arg_value>\n</tool_call>", K.UNKNOWN_TOOL),
    "dsml": ("dsml",
             f'<{DS}function_calls>\n<{DS}invoke name="unknown_tool">\n<{DS}parameter name="code" string="true">'
             f'example: <{DS}function_calls>\n<{DS}invoke name="get_time">\n</{DS}invoke>\n</{DS}function_calls>'
             f'</{DS}parameter>\n</{DS}invoke>\n</{DS}function_calls>', K.UNKNOWN_TOOL),
    "xtml": ("xtml",
             '<xtml:calls><xtml:call name="unknown_tool"><xtml:arg name="code">example: <xtml:calls>'
             '<xtml:call name="get_time"></xtml:call></xtml:calls></xtml:arg></xtml:call></xtml:calls>',
             K.UNKNOWN_TOOL),
    "recipient_mismatch": ("recipients",
                           '<|start|>assistant to=functions.get_time<|message|><atem:function_calls>'
                           '<atem:invoke name="get_weather"><atem:parameter name="city">example: <atem:function_calls>'
                           '<atem:invoke name="get_time"></atem:invoke></atem:function_calls></atem:parameter>'
                           '</atem:invoke></atem:function_calls><|eom|>', K.RECIPIENT_MISMATCH),
}


@pytest.mark.parametrize("case", sorted(QUOTED))
def test_a_call_quoted_in_a_rejected_invocation_is_no_call(case):
    name, text, error = QUOTED[case]
    results = [parse(name, text, size) for size in (1, 4, 10**6)]
    assert results[1] == results[0] == results[2]
    result = results[0]
    assert not result.tool_calls
    assert error in [e.kind for e in result.errors]
    if name != "recipients":  # a tool frame shows no content: its raw text is markup
        assert result.content == text


@pytest.mark.parametrize("size", [1, 4, 10**6])
def test_an_inline_name_of_prose_still_lets_the_call_after_it_open(size):
    """GLM's inline name ends at the newline: prose after a written opener is read as a name, which no
    tool's name is (it holds whitespace), so the opener after it still opens the real call's block."""
    before = "Write <tool_call> to call a tool. Checking.\n"
    result = parse("glm", before + "<tool_call>get_time\n</tool_call>", size)
    assert [(call.name, call.arguments) for call in result.tool_calls] == [("get_time", "{}")]
    assert result.content == before


def test_a_whole_number_integer_is_read_exactly():
    """Through a float, 9007199254740993.0 became 9007199254740992 (2**53 + 1 has no float) and 1e-400
    became 0, each reported valid."""
    I = frozenset({ValueKind.INTEGER})
    assert typed_value("9007199254740993.0", I) == ("9007199254740993", True)
    assert typed_value("-123456789012345678901234567890.000", I) == ("-123456789012345678901234567890", True)
    assert typed_value("1e-400", I) == ('"1e-400"', False)
    assert typed_value("1.5e300", I) == ("15" + "0" * 299, True)
