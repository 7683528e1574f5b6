"""Contract frontend data -> parser syntax, single-token delimiters, prompt rules, grammar envelope.

The mapped records are compared with the example syntaxes the parser golden tests run on, so a
contract that spells a family the usual way reaches exactly the tested parser configuration.
"""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from contract.documents import example_text
from helios.contract import serving_pb2 as spb
from helios.errors import ContractError
from helios.frontend.decoding import syntax as S
from helios.frontend.structured.contract_syntax import (
    TOOL_FIELDS,
    FrontendSyntax,
    check_tool_fields,
    frame_start,
    tool_syntax,
)
from helios.frontend.parsers import FramePosition, FrameStart, OutputStart
from helios.frontend.preparation.prompt import Prompt, ReasoningState, initial_reasoning_state
from helios.frontend.decoding.syntax import ReasoningSyntaxKind as R, ToolSyntaxKind as T

from .parsers.conftest import small_bpe
from .served import dsml_frontend, qwen_frontend, recipient_frontend

F = "contract.model.frontend"


def frontend_message(section: dict) -> spb.FrontendContract:
    message = spb.FrontendContract(image_preparation=spb.IMAGE_PREPARATION_NONE, image_layout=spb.IMAGE_LAYOUT_NONE)
    json_format.ParseDict(section, message)
    return message


def encoder(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def tool_message(**fields) -> spb.ToolSyntax:
    return spb.ToolSyntax(**fields)


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    return FrontendSyntax.from_contract(frontend_message(qwen_frontend(qwen_tokenizer)), encoder(qwen_tokenizer))


@pytest.fixture(scope="module")
def recipient_tokenizer():
    return small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>", "<|end|>"])


# -- families ------------------------------------------------------------------------------------


def test_qwen_contract_maps_to_the_tested_think_and_function_tag_syntax(qwen, qwen_tokenizer):
    assert qwen.output == S.OutputSyntax(
        R.THINK_TAGS, T.QWEN_CODER_FUNCTIONS, think=S.example_think_tags("<tool_call>"), tools=S.example_qwen_coder()
    )
    ids = {text: qwen_tokenizer.token_to_id(text) for text in ("<think>", "</think>", "<tool_call>")}
    for text, token_id in ids.items():
        assert qwen.delimiters.id_of(text) == token_id
    rules = qwen.prompt_rules
    assert (rules.message_start, rules.assistant_header, rules.message_ends) == ("<|im_start|>", "assistant\n", ("<|im_end|>",))
    assert rules.reasoning.terminal_markers == ("<tool_call>",)


def test_envelope_follows_the_prompt_state_and_declares_the_answer_separator(qwen, qwen_tokenizer):
    envelope = qwen.envelope(ReasoningState.OPEN)
    assert (envelope.state, envelope.open_text, envelope.close_text, envelope.separator) == (
        ReasoningState.OPEN, "<think>", "</think>", "\n\n"
    )
    assert envelope.close_token_id == qwen_tokenizer.token_to_id("</think>")
    assert qwen.envelope(ReasoningState.CLOSED).state is ReasoningState.CLOSED
    assert not qwen.has_frames


def test_dsml_contract_maps_to_the_tested_dsml_syntax(deepseek_tokenizer):
    syntax = FrontendSyntax.from_contract(frontend_message(dsml_frontend(deepseek_tokenizer)), encoder(deepseek_tokenizer))
    think = S.ThinkSyntax("<think>", "</think>")
    assert syntax.output == S.OutputSyntax(R.THINK_TAGS, T.DSML, think=think, tools=S.example_dsml())
    assert syntax.delimiters.id_of("</think>") == deepseek_tokenizer.token_to_id("</think>")
    assert syntax.prompt_rules.message_ends == ("<｜end▁of▁sentence｜>", "<｜tool▁outputs▁end｜>")


def test_embedded_message_ends_keep_tool_outputs_from_opening_reasoning(deepseek_tokenizer):
    rules = FrontendSyntax.from_contract(frontend_message(dsml_frontend(deepseek_tokenizer)), encoder(deepseek_tokenizer)).prompt_rules
    resumed = "<｜Assistant｜></think><｜tool▁outputs▁begin｜><think>in a tool<｜tool▁outputs▁end｜>"
    assert initial_reasoning_state(resumed, rules)[0] is ReasoningState.UNOPENED
    assert initial_reasoning_state(resumed + "<think>", rules)[0] is ReasoningState.OPEN


def test_glm_and_xtml_tool_syntax_from_contract_fields():
    glm = tool_message(opener="<tool_call>", closer="</tool_call>", tag_separator="\n", parameter_open="<arg_key>",
                       name_end="</arg_key>", value_open="<arg_value>", parameter_close="</arg_value>", block_lead="\n")
    assert tool_syntax(T.GLM_ARGUMENTS, glm) == S.example_glm_arguments()
    xtml = tool_message(opener="<xtml:calls>", closer="</xtml:calls>", invoke_open='<xtml:call name="',
                        invoke_close="</xtml:call>", parameter_open='<xtml:arg name="', parameter_close="</xtml:arg>",
                        name_end='">', block_lead="\n")
    assert tool_syntax(T.XTML, xtml) == S.example_xtml()
    assert tool_syntax(T.NONE, spb.ToolSyntax()) is None


def test_xtml_think_reads_its_terminal_marker_and_wrapping():
    section = {
        "tool_parser": "TOOL_PARSER_XTML", "reasoning_parser": "REASONING_PARSER_XTML_THINK",
        "tool_syntax": {"opener": "<xtml:calls>", "closer": "</xtml:calls>", "invoke_open": '<xtml:call name="',
                        "invoke_close": "</xtml:call>", "parameter_open": '<xtml:arg name="',
                        "parameter_close": "</xtml:arg>", "name_end": '">', "block_lead": "\n"},
        "reasoning_syntax": {"open": "<xtml:think>", "close": "</xtml:think>", "terminal_markers": ["<xtml:calls>"],
                             "wrapping_newlines": 1, "after_close": "\n"},
        "assistant_boundary": {"message_start": "<|im_start|>", "message_end": "<|im_end|>", "assistant_header": "assistant\n"},
    }
    syntax = FrontendSyntax.from_contract(frontend_message(section), lambda text: list(range(len(text))))
    assert syntax.output == S.OutputSyntax(R.XTML_THINK, T.XTML, think=S.example_xtml_think(), tools=S.example_xtml())
    assert syntax.delimiters.id_of("<xtml:think>") is None  # no spelling is one token here


def test_recipient_contract_maps_to_the_tested_frame_syntax(recipient_tokenizer):
    syntax = FrontendSyntax.from_contract(frontend_message(recipient_frontend()), encoder(recipient_tokenizer))
    assert syntax.output == S.OutputSyntax(R.RECIPIENT_HEADERS, T.ATEM_RECIPIENTS, frames=S.example_recipients())
    assert syntax.delimiters.id_of("<|start|>") == recipient_tokenizer.token_to_id("<|start|>")
    assert syntax.has_frames and syntax.envelope(ReasoningState.NO_REASONING) is None
    prompt = Prompt("<|start|>user<|message|>hi<|end|><|start|>assistant", (1,), ReasoningState.NO_REASONING, "", 0)
    assert syntax.output_start(prompt) == OutputStart(
        ReasoningState.NO_REASONING, FrameStart(FramePosition.HEADER, header_text="assistant")
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", FrameStart()),
        ("<|start|>user<|message|>hi<|end|>", FrameStart()),
        ("<|start|>user<|message|>hi<|end|><|start|>assistant to=self<|message|>thinking<|eom|>", FrameStart()),
        ("<|start|>assistant to", FrameStart(FramePosition.HEADER, header_text="assistant to")),
        ("<|start|>assistant to=functions.get_weather<|message|>",
         FrameStart(FramePosition.BODY, recipient="functions.get_weather")),
        ("<|start|>assistant to=self<|message|>partial thought", FrameStart(FramePosition.BODY, recipient="self")),
        ("<|start|>system<|message|>", FrameStart()),  # not an assistant header
    ],
)
def test_frame_start_from_the_end_of_the_prompt(text, expected):
    assert frame_start(text, S.example_recipients(), ("<|end|>",)) == expected


def test_the_example_contract_maps():
    frontend = spb.FrontendContract()
    json_format.ParseDict(json.loads(example_text())["contract"]["model"]["frontend"], frontend)
    single = {"<think>": [128013], "</think>": [128014]}
    syntax = FrontendSyntax.from_contract(frontend, lambda text: single.get(text, [1, 2]))
    assert syntax.output.tools == S.example_qwen_coder()
    assert syntax.output.think == S.example_think_tags("<tool_call>")


# -- rejected contracts --------------------------------------------------------------------------


def qwen_section(qwen_tokenizer, **changes) -> dict:
    section = qwen_frontend(qwen_tokenizer)
    for path, value in changes.items():
        part, name = path.split("__")
        if value is None:
            section[part].pop(name)
        else:
            section[part][name] = value
    return section


@pytest.mark.parametrize(
    "changes, path",
    [
        ({"tool_syntax__parameter_open": None}, f"{F}.tool_syntax.parameter_open"),
        ({"tool_syntax__value_open": "<v>"}, f"{F}.tool_syntax.value_open"),
        ({"tool_syntax__string_true": "yes"}, f"{F}.tool_syntax.string_true"),
        ({"reasoning_syntax__close_token_id": 7}, f"{F}.reasoning_syntax.close_token_id"),
        ({"reasoning_syntax__open_token_id": None}, f"{F}.reasoning_syntax.open_token_id"),
        ({"assistant_boundary__named_tool_prefix": "functions."}, f"{F}.assistant_boundary.named_tool_prefix"),
        ({"assistant_boundary__embedded_message_ends": [""]}, f"{F}.assistant_boundary.embedded_message_ends[0]"),
    ],
)
def test_inconsistent_frontend_data_fails_startup(qwen_tokenizer, changes, path):
    section = qwen_section(qwen_tokenizer, **changes)
    with pytest.raises(ContractError) as caught:
        FrontendSyntax.from_contract(frontend_message(section), encoder(qwen_tokenizer))
    assert caught.value.path == path


def test_recipient_controls_must_be_single_tokens(qwen_tokenizer):
    with pytest.raises(ContractError) as caught:
        FrontendSyntax.from_contract(frontend_message(recipient_frontend()), encoder(qwen_tokenizer))
    assert caught.value.path == f"{F}.assistant_boundary.message_start"


def test_every_family_lists_only_real_tool_syntax_fields():
    names = {field.name for field in spb.ToolSyntax.DESCRIPTOR.fields}
    for use in TOOL_FIELDS.values():
        assert use.required <= names and use.optional <= names and not use.required & use.optional
    check_tool_fields(T.ATEM_RECIPIENTS, tool_message(**{name: "x" for name in TOOL_FIELDS[T.ATEM_RECIPIENTS].required}))
    with pytest.raises(ContractError, match="does not use"):
        check_tool_fields(T.ATEM_RECIPIENTS, tool_message(opener="x", closer="x", invoke_open="x", invoke_close="x",
                                                          parameter_open="x", parameter_close="x", name_end="x",
                                                          block_lead="\n"))
