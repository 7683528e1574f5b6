"""A tool block opener written in prose (or an opener left without its invocation) before a real
call: the call is still a call.

Before, the stray opener began a block that was rejected (text before its first invocation, or an
unknown GLM name), and the whole rejected block ran to the next block closer: the real call's own
opener, invocation and closer became content, and the request had no tool call. Qwen3-Coder's
reference parser reads the call (its function regex searches the text between the first opener and
the first closer). Now a block opener before a block's first invocation, or in rejected block text,
opens a new block; the text before it stays content, reported as before.

JSON-call blocks (Hermes ``<tool_call>``, DeepSeek V3's ``<｜tool▁calls▁begin｜>``) had the same
defect: the prose's block ran to the real call's closer and did not parse, so the call was content.
Now a block whose body starts with text no call starts with is content from that text on, and the
next opener opens a block (whitespace before an opener is its lead there, never content).
"""

from __future__ import annotations

import pytest

from helios.frontend.decoding import syntax as S
from helios.frontend.decoding.events import ParseErrorKind as K
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind as R, ToolSyntaxKind as T
from helios.frontend.parsers import OutputPipeline, OutputRequest, OutputStart, ReasoningState, TokenDelimiters

from .golden import check_stream_invariants, control_feeds, run
from .tools import TOOLS

DS = "｜DSML｜"
RECIPIENT_IDS = {"<|start|>": 101, "<|message|>": 102, "<|eom|>": 103}
FAMILIES = {  # (syntax, the block opener, a call of get_time with its opener)
    "qwen-coder": (OutputSyntax(R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, S.example_think_tags("<tool_call>"),
                                S.example_qwen_coder()),
                   "<tool_call>", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    "glm": (OutputSyntax(R.THINK_TAGS, T.GLM_ARGUMENTS, S.example_think_tags(), S.example_glm_arguments()),
            "<tool_call>", "<tool_call>get_time\n</tool_call>"),
    "dsml": (OutputSyntax(R.THINK_TAGS, T.DSML, S.example_think_tags(f"<{DS}function_calls>"), S.example_dsml()),
             f"<{DS}function_calls>",
             f'<{DS}function_calls>\n<{DS}invoke name="get_time">\n</{DS}invoke>\n</{DS}function_calls>'),
    "xtml": (OutputSyntax(R.XTML_THINK, T.XTML, S.example_xtml_think(), S.example_xtml()),
             "<xtml:calls>", '<xtml:calls><xtml:call name="get_time"></xtml:call></xtml:calls>'),
    "hermes": (OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags("<tool_call>"), S.example_hermes()),
               "<tool_call>", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'),
    "deepseek-v3": (OutputSyntax(R.THINK_TAGS, T.JSON_CALLS, S.example_think_tags(), S.example_deepseek_v3()),
                    "<｜tool▁calls▁begin｜>",
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "recipients": (OutputSyntax(R.RECIPIENT_HEADERS, T.ATEM_RECIPIENTS, frames=S.example_recipients()),
                   "<atem:function_calls>",
                   '<atem:function_calls><atem:invoke name="get_time"></atem:invoke></atem:function_calls>'),
}


def parse(name: str, text: str, size: int):
    syntax = FAMILIES[name][0]
    controls = RECIPIENT_IDS if name == "recipients" else {}
    pipeline = OutputPipeline.create(syntax, TokenDelimiters(controls),
                                     OutputRequest(TOOLS, "c", OutputStart(ReasoningState.CLOSED)))
    outcome = run(pipeline, control_feeds(controls, text, size))
    check_stream_invariants(outcome.events, outcome.result, "c")
    return outcome.result


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("prose", ["Write OPENER to call a tool. Checking.\n", "OPENER\n", "OPENER"])
def test_an_opener_before_a_call_does_not_swallow_it(name, prose):
    _, opener, call = FAMILIES[name]
    before = prose.replace("OPENER", opener)
    text = before + call
    if name == "recipients":
        text = f"<|start|>assistant to=functions<|message|>{text}<|eom|>"
    results = [parse(name, text, size) for size in (1, 4, 10**6)]
    assert results[1] == results[0] == results[2]
    result = results[0]
    assert [(call.name, call.arguments, call.complete) for call in result.tool_calls] == [("get_time", "{}", True)]
    assert K.MALFORMED_CALL in [error.kind for error in result.errors] or name == "glm"
    if name in ("hermes", "deepseek-v3"):  # whitespace before an opener is its lead
        assert result.content == before.rstrip()
    elif name != "recipients":  # a tool frame shows no content: its stray text is markup
        assert result.content == before
