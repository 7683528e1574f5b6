"""FrontendContract rules: parser/image selector pairings and their syntax and layout data.

Selectors are independent enums; the only pairings are the ones the specification states:
XTML think reasoning needs the XTML tool parser, and recipient-header reasoning and ATEM
recipient tools require each other, and so do the two harmony channel parsers (whose markup is
`channel_syntax`, not `tool_syntax`). Syntax data is required exactly where a selector uses it.
"""

from __future__ import annotations

import math

from helios.contract import serving_pb2 as spb
from helios.contract.rules import MODEL, enum_label, fail, require
from helios.contract.validate_model import input_range

FRONTEND = f"{MODEL}.frontend"
TAG_REASONING = frozenset({spb.REASONING_PARSER_THINK_TAGS, spb.REASONING_PARSER_XTML_THINK})
RECIPIENT_FIELDS = (
    "recipient_prefix",
    "header_end",
    "self_recipient",
    "generic_tool_recipient",
    "internal_message_end",
)
CHANNEL_CONTROLS = (
    "start_control", "channel_control", "message_control", "end_control", "call_control", "return_control",
    "constrain_control",
)
CHANNEL_TEXT = ("role", "recipient_marker", "tool_namespace", "final_channel", "tool_channel", "tool_content_type")
# Random tool-call ids: at least 8 alphanumerics (62**8, about 2e14 ids) so that no two calls of one
# conversation draw the same; at most 64, as no template asks for more.
TOOL_CALL_ID_LENS = range(8, 65)


def check_frontend(model: spb.ModelContract) -> None:
    frontend = model.frontend
    _check_pairings(frontend)
    _check_tool_syntax(frontend)
    _check_reasoning_syntax(model)
    _check_boundary(frontend)
    _check_channel_syntax(frontend)
    if frontend.tool_call_id_len:  # 0: `call_<request id>_<index>` ids (cores before the field)
        require(frontend.tool_call_id_len in TOOL_CALL_ID_LENS, f"{FRONTEND}.tool_call_id_len",
                f"random tool-call ids are {TOOL_CALL_ID_LENS.start} to {TOOL_CALL_ID_LENS.stop - 1} characters")
    roles: set[int] = set()
    for i, rule in enumerate(frontend.prefix_boundaries):
        path = f"{FRONTEND}.prefix_boundaries[{i}].role"
        require(rule.role not in roles, path, f"duplicate rule for role {enum_label(spb.MessageRole, rule.role)}")
        roles.add(rule.role)
    _check_images(model)


def _check_pairings(frontend: spb.FrontendContract) -> None:
    reasoning, tools = frontend.reasoning_parser, frontend.tool_parser
    if reasoning == spb.REASONING_PARSER_XTML_THINK:
        require(
            tools == spb.TOOL_PARSER_XTML,
            f"{FRONTEND}.reasoning_parser",
            "XTML_THINK reasoning requires the XTML tool parser",
        )
    if reasoning == spb.REASONING_PARSER_RECIPIENT_HEADER:
        require(
            tools == spb.TOOL_PARSER_ATEM_RECIPIENT,
            f"{FRONTEND}.reasoning_parser",
            "RECIPIENT_HEADER reasoning is paired with the ATEM_RECIPIENT tool parser",
        )
    if tools == spb.TOOL_PARSER_ATEM_RECIPIENT:
        require(
            reasoning == spb.REASONING_PARSER_RECIPIENT_HEADER,
            f"{FRONTEND}.tool_parser",
            "ATEM_RECIPIENT tools are paired with RECIPIENT_HEADER reasoning",
        )


def _check_harmony_pairing(frontend: spb.FrontendContract) -> None:
    reasoning = frontend.reasoning_parser == spb.REASONING_PARSER_HARMONY_CHANNELS
    tools = frontend.tool_parser == spb.TOOL_PARSER_HARMONY_CHANNELS
    if reasoning != tools:
        fail(f"{FRONTEND}.reasoning_parser", "HARMONY_CHANNELS reasoning and tools are only used together")


def _check_channel_syntax(frontend: spb.FrontendContract) -> None:
    path = f"{FRONTEND}.channel_syntax"
    if frontend.tool_parser != spb.TOOL_PARSER_HARMONY_CHANNELS:
        require(not frontend.HasField("channel_syntax"), path, "only the HARMONY_CHANNELS parsers use channel syntax")
        return
    require(frontend.HasField("channel_syntax"), path, "harmony channel parsers need their syntax data")
    syntax = frontend.channel_syntax
    for name in (*CHANNEL_CONTROLS, *CHANNEL_TEXT):
        require(getattr(syntax, name) != "", f"{path}.{name}", "must not be empty")
    controls = [getattr(syntax, name) for name in CHANNEL_CONTROLS]
    require(len(set(controls)) == len(controls), path, "control spellings must differ")
    for name in ("reasoning_channels", "content_channels"):
        values = list(getattr(syntax, name))
        require(values and all(values), f"{path}.{name}", "must be a non-empty list of non-empty names")
    require(not set(syntax.reasoning_channels) & set(syntax.content_channels), f"{path}.content_channels",
            "a channel is either reasoning or content")
    require(syntax.final_channel in syntax.content_channels, f"{path}.final_channel", "must be a content channel")


def _check_tool_syntax(frontend: spb.FrontendContract) -> None:
    path = f"{FRONTEND}.tool_syntax"
    _check_harmony_pairing(frontend)
    if frontend.tool_parser in (spb.TOOL_PARSER_NONE, spb.TOOL_PARSER_HARMONY_CHANNELS):
        require(not frontend.HasField("tool_syntax"), path, "this tool parser declares no tool syntax")
        return
    require(frontend.HasField("tool_syntax"), path, "the selected tool parser needs its syntax data")
    if frontend.tool_parser == spb.TOOL_PARSER_JSON_CALLS:
        # A JSON-call block may run to the end of the output (no closer), or be the whole answer
        # when it starts with a JSON object (no opener); the invocation still needs a spelling.
        syntax = frontend.tool_syntax
        require(
            (syntax.name_key != "") != (syntax.invoke_open != ""),
            f"{path}.name_key",
            "JSON calls name their function either by a key (name_key) or by markup (invoke_open)",
        )
        return
    require(frontend.tool_syntax.opener != "", f"{path}.opener", "tool-call opener is empty")
    require(frontend.tool_syntax.closer != "", f"{path}.closer", "tool-call closer is empty")


def _check_reasoning_syntax(model: spb.ModelContract) -> None:
    frontend = model.frontend
    path = f"{FRONTEND}.reasoning_syntax"
    if frontend.reasoning_parser not in TAG_REASONING:
        require(
            not frontend.HasField("reasoning_syntax"),
            path,
            "only THINK_TAGS and XTML_THINK reasoning declare reasoning syntax",
        )
        return
    require(frontend.HasField("reasoning_syntax"), path, "tag reasoning needs its syntax data")
    syntax = frontend.reasoning_syntax
    require(syntax.open != "", f"{path}.open", "reasoning open marker is empty")
    require(syntax.close != "", f"{path}.close", "reasoning close marker is empty")
    require(syntax.open != syntax.close, f"{path}.close", "open and close markers must differ")
    begin, end = input_range(model)
    for name in ("open_token_id", "close_token_id"):
        if syntax.HasField(name):
            token = getattr(syntax, name)
            require(begin <= token < end, f"{path}.{name}", f"token {token} is outside the input vocabulary")
    opener = frontend.tool_syntax.opener if frontend.HasField("tool_syntax") else ""
    for i, marker in enumerate(syntax.terminal_markers):
        require(
            opener != "" and marker == opener,
            f"{path}.terminal_markers[{i}]",
            f"reasoning terminal marker {marker!r} is not the declared tool syntax's opener ({opener!r})",
        )


def _check_boundary(frontend: spb.FrontendContract) -> None:
    path = f"{FRONTEND}.assistant_boundary"
    require(frontend.HasField("assistant_boundary"), path, "assistant boundary markers are required")
    boundary = frontend.assistant_boundary
    require(boundary.message_end != "", f"{path}.message_end", "message end marker is empty")
    require(boundary.assistant_header != "", f"{path}.assistant_header", "assistant header is empty")
    recipient = frontend.reasoning_parser == spb.REASONING_PARSER_RECIPIENT_HEADER
    for name in RECIPIENT_FIELDS:
        value = getattr(boundary, name)
        if recipient:
            require(value != "", f"{path}.{name}", "recipient-header frames declare this marker")
        else:
            require(value == "", f"{path}.{name}", "only RECIPIENT_HEADER reasoning uses recipient frames")
    if recipient:
        require(len(boundary.visible_recipients) > 0, f"{path}.visible_recipients", "no visible recipient")
    else:
        require(
            len(boundary.visible_recipients) == 0,
            f"{path}.visible_recipients",
            "only RECIPIENT_HEADER reasoning uses recipient frames",
        )


def _check_images(model: spb.ModelContract) -> None:
    frontend = model.frontend
    has_vision = model.HasField("vision")
    for name, none_value, data in (
        ("image_preparation", spb.IMAGE_PREPARATION_NONE, "image_preparation_data"),
        ("image_layout", spb.IMAGE_LAYOUT_NONE, "image_layout_data"),
    ):
        selector_is_none = getattr(frontend, name) == none_value
        if has_vision:
            require(not selector_is_none, f"{FRONTEND}.{name}", "the contract declares vision; select an implementation")
            require(frontend.HasField(data), f"{FRONTEND}.{data}", f"the selected {name} needs its data")
        else:
            require(selector_is_none, f"{FRONTEND}.{name}", "a text-only contract (no vision) selects NONE")
            require(not frontend.HasField(data), f"{FRONTEND}.{data}", "a text-only contract declares no image data")
    if has_vision:
        _check_preparation(model)
        _check_layout(model)


def _check_preparation(model: spb.ModelContract) -> None:
    data = model.frontend.image_preparation_data
    path = f"{FRONTEND}.image_preparation_data"
    require(data.patch_size > 0, f"{path}.patch_size", "must be nonzero")
    require(data.merge_size > 0, f"{path}.merge_size", "must be nonzero")
    ratio = model.vision.patches_per_feature
    require(
        data.merge_size * data.merge_size == ratio,
        f"{path}.merge_size",
        f"merge_size^2 must equal vision.patches_per_feature ({ratio})",
    )
    require(len(data.mean) == 3, f"{path}.mean", "three channel means are required")
    require(len(data.std) == 3, f"{path}.std", "three channel deviations are required")
    for i, value in enumerate(data.mean):
        require(math.isfinite(value), f"{path}.mean[{i}]", "must be finite")
    for i, value in enumerate(data.std):
        require(math.isfinite(value) and value > 0, f"{path}.std[{i}]", "must be finite and positive")
    require(data.max_pixels > 0, f"{path}.max_pixels", "must be nonzero")
    require(data.min_pixels <= data.max_pixels, f"{path}.min_pixels", "exceeds max_pixels")


def _check_layout(model: spb.ModelContract) -> None:
    data = model.frontend.image_layout_data
    path = f"{FRONTEND}.image_layout_data"
    sentinels = set(model.input_vocabulary.image_sentinel_ids)
    require(len(data.feature_ids) > 0, f"{path}.feature_ids", "no feature id declared")
    for i, token in enumerate(data.feature_ids):
        require(token in sentinels, f"{path}.feature_ids[{i}]", f"feature id {token} is not a declared image sentinel")
    begin, end = input_range(model)
    for i, span in enumerate(data.atomic_spans):
        require(len(span.token_ids) > 0, f"{path}.atomic_spans[{i}].token_ids", "atomic span is empty")
        for j, token in enumerate(span.token_ids):
            require(
                begin <= token < end,
                f"{path}.atomic_spans[{i}].token_ids[{j}]",
                f"token {token} is outside the input vocabulary",
            )
    names: set[str] = set()
    require(len(data.outputs) > 0, f"{path}.outputs", "the layout produces no vision tensor")
    for i, name in enumerate(data.outputs):
        require(name != "", f"{path}.outputs[{i}]", "output name is empty")
        if name in names:
            fail(f"{path}.outputs[{i}]", f"duplicate output {name!r}")
        names.add(name)
