"""Invalid contracts, one per rule, on the serving contract side (serving, model, frontend,
graphs). Each case mutates a copy of the example document and returns the field path the
`ContractError` must name.
"""

from __future__ import annotations

from contract.documents import graph, model, state_view

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def sampling(doc):
    return doc["contract"]["defaults"]["sampling"]


def frontend(doc):
    return model(doc)["frontend"]


F = "contract.model.frontend"
S = "contract.defaults.sampling"


# -- serving ---------------------------------------------------------------------------------
@case
def unsupported_version(doc):
    model(doc)["version"] = 4
    return "contract.model.version"


@case
def missing_model(doc):
    del doc["contract"]["model"]
    return "contract.model"


@case
def empty_served_id(doc):
    doc["contract"]["served_id"] = ""
    return "contract.served_id"


@case
def alias_repeats_served_id(doc):
    doc["contract"]["aliases"][0] = doc["contract"]["served_id"]
    return "contract.aliases[0]"


@case
def duplicate_alias(doc):
    doc["contract"]["aliases"][1] = doc["contract"]["aliases"][0]
    return "contract.aliases[1]"


@case
def empty_cache_identity(doc):
    del doc["contract"]["cache_identity"]
    return "contract.cache_identity"


@case
def zero_context(doc):
    doc["contract"]["context_tokens"] = 0
    return "contract.context_tokens"


@case
def prefill_exceeds_context(doc):
    doc["contract"]["prefill_tokens"] = 65536
    return "contract.prefill_tokens"


@case
def prefill_exceeds_captured_prefill(doc):
    doc["contract"]["prefill_tokens"] = 16384
    return "contract.prefill_tokens"


@case
def zero_concurrency(doc):
    doc["contract"]["max_concurrency"] = 0
    return "contract.max_concurrency"


@case
def concurrency_exceeds_decode_rows(doc):
    doc["contract"]["max_concurrency"] = 65
    return "contract.max_concurrency"


@case
def pages_cannot_hold_one_context(doc):
    doc["contract"]["page_capacity"] = 511
    return "contract.page_capacity"


@case
def widths_not_ascending(doc):
    doc["contract"]["speculative_widths"] = [4, 1]
    return "contract.speculative_widths[1]"


@case
def width_without_speculative_variant(doc):
    doc["contract"]["speculative_widths"] = [1, 4, 8]
    return "contract.speculative_widths[2]"


@case
def missing_defaults(doc):
    del doc["contract"]["defaults"]
    return "contract.defaults"


@case
def negative_temperature(doc):
    sampling(doc)["temperature"] = -0.1
    return f"{S}.temperature"


@case
def top_p_zero(doc):
    sampling(doc)["top_p"] = 0
    return f"{S}.top_p"


@case
def min_p_above_one(doc):
    sampling(doc)["min_p"] = 1.5
    return f"{S}.min_p"


@case
def repetition_penalty_zero(doc):
    sampling(doc)["repetition_penalty"] = 0
    return f"{S}.repetition_penalty"


@case
def presence_penalty_out_of_range(doc):
    sampling(doc)["presence_penalty"] = 2.5
    return f"{S}.presence_penalty"


@case
def frequency_penalty_nan(doc):
    sampling(doc)["frequency_penalty"] = "NaN"
    return f"{S}.frequency_penalty"


@case
def output_limit_above_context(doc):
    sampling(doc)["max_output_tokens"] = 40000
    return f"{S}.max_output_tokens"


@case
def fixed_seed_policy_without_seed(doc):
    sampling(doc)["seed_policy"] = "SEED_POLICY_FIXED"
    return f"{S}.seed"


@case
def seed_with_random_policy(doc):
    sampling(doc)["seed"] = "7"
    return f"{S}.seed"


@case
def unspecified_seed_policy(doc):
    sampling(doc)["seed_policy"] = "SEED_POLICY_UNSPECIFIED"
    return f"{S}.seed_policy"


@case
def no_eos_ids(doc):
    doc["contract"]["defaults"]["eos_token_ids"] = []
    return "contract.defaults.eos_token_ids"


@case
def eos_outside_sampled_vocabulary(doc):
    doc["contract"]["defaults"]["eos_token_ids"][0] = 128256
    return "contract.defaults.eos_token_ids[0]"


@case
def duplicate_eos(doc):
    doc["contract"]["defaults"]["eos_token_ids"][2] = 128001
    return "contract.defaults.eos_token_ids[2]"


@case
def duplicate_template_token(doc):
    doc["contract"]["defaults"]["template_tokens"][1]["name"] = "bos_token"
    return "contract.defaults.template_tokens[1].name"


@case
def template_token_outside_inputs(doc):
    doc["contract"]["defaults"]["template_tokens"][0]["token_id"] = 200000
    return "contract.defaults.template_tokens[0].token_id"


# -- vocabularies, vision, cache ---------------------------------------------------------------
@case
def empty_sampled_range(doc):
    model(doc)["vocabulary"]["sampled"]["begin"] = 128256
    return "contract.model.vocabulary.sampled.end"


@case
def histogram_smaller_than_vocabulary(doc):
    model(doc)["vocabulary"]["histogram_bins"] = 1000
    return "contract.model.vocabulary.histogram_bins"


@case
def mask_too_narrow(doc):
    model(doc)["vocabulary"]["mask_words"] = 4007
    return "contract.model.vocabulary.mask_words"


@case
def input_vocabulary_in_version_1(doc):
    model(doc)["version"] = 1
    return "contract.model.input_vocabulary"


@case
def input_vocabulary_missing_in_version_3(doc):
    del model(doc)["input_vocabulary"]
    return "contract.model.input_vocabulary"


@case
def sampled_range_outside_input_range(doc):
    model(doc)["input_vocabulary"]["input"]["end"] = 100000
    return "contract.model.vocabulary.sampled"


@case
def sentinel_outside_input_range(doc):
    model(doc)["input_vocabulary"]["image_sentinel_ids"].append(200000)
    return "contract.model.input_vocabulary.image_sentinel_ids[1]"


@case
def sentinel_is_sampled(doc):
    model(doc)["input_vocabulary"]["image_sentinel_ids"].append(5)
    return "contract.model.input_vocabulary.image_sentinel_ids[1]"


@case
def excluded_id_outside_sampled_range(doc):
    model(doc)["vocabulary"]["excluded_ids"] = [5, 200000]
    return "contract.model.vocabulary.excluded_ids[1]"


@case
def excluded_id_twice(doc):
    model(doc)["vocabulary"]["excluded_ids"] = [5, 5]
    return "contract.model.vocabulary.excluded_ids[1]"


@case
def eos_id_excluded(doc):
    eos = doc["contract"]["defaults"]["eos_token_ids"][0]
    model(doc)["vocabulary"]["excluded_ids"] = [eos]
    return "contract.defaults.eos_token_ids[0]"


@case
def vision_in_version_1(doc):
    model(doc)["version"] = 1
    del model(doc)["input_vocabulary"]
    return "contract.model.vision"


@case
def zero_feature_slots(doc):
    model(doc)["vision"]["feature_slots"] = 0
    return "contract.model.vision.feature_slots"


@case
def window_larger_than_slots(doc):
    model(doc)["vision"]["features_per_window"] = 8192
    return "contract.model.vision.features_per_window"


@case
def patch_capacities_not_ascending(doc):
    model(doc)["vision"]["patch_capacities"] = [16384, 1024]
    return "contract.model.vision.patch_capacities[1]"


@case
def patch_capacity_not_multiple_of_ratio(doc):
    model(doc)["vision"]["patch_capacities"][0] = 1022
    return "contract.model.vision.patch_capacities[0]"


@case
def patch_capacity_over_feature_slots(doc):
    model(doc)["vision"]["patch_capacities"].append(32768)
    return "contract.model.vision.patch_capacities[2]"


@case
def page_tokens_zero(doc):
    model(doc)["cache"]["page_tokens"] = 0
    return "contract.model.cache.page_tokens"


@case
def paged_region_without_record_ratio(doc):
    del model(doc)["cache"]["regions"][0]["tokens_per_record"]
    return "contract.model.cache.regions[0].tokens_per_record"


@case
def record_ratio_not_dividing_page(doc):
    model(doc)["cache"]["regions"][0]["tokens_per_record"] = 3
    return "contract.model.cache.regions[0].tokens_per_record"


@case
def window_on_continuation_region(doc):
    model(doc)["cache"]["regions"][2]["window_tokens"] = 4096
    return "contract.model.cache.regions[2].window_tokens"


@case
def sliding_window_without_extent(doc):
    model(doc)["cache"]["regions"][2]["kind"] = "HISTORY_KIND_SLIDING_WINDOW"
    return "contract.model.cache.regions[2].window_tokens"


@case
def region_without_planes(doc):
    model(doc)["cache"]["regions"][0]["planes"] = []
    return "contract.model.cache.regions[0].planes"


@case
def duplicate_region_name(doc):
    model(doc)["cache"]["regions"][1]["name"] = "attention"
    return "contract.model.cache.regions[1].name"


@case
def empty_state_view(doc):
    del state_view(doc, "pending_token")[0]["byte_extent"]
    return "contract.model.state_views[0].byte_extent"


@case
def duplicate_state_view(doc):
    state_view(doc, "rng_counter")[0]["name"] = "pending_token"
    return "contract.model.state_views[1].name"


@case
def no_graphs(doc):
    model(doc)["graphs"] = []
    return "contract.model.graphs"


@case
def missing_cache(doc):
    del model(doc)["cache"]
    return "contract.model.cache"


@case
def missing_frontend(doc):
    del model(doc)["frontend"]
    return "contract.model.frontend"


# -- frontend ----------------------------------------------------------------------------------
@case
def xtml_think_without_xtml_tools(doc):
    frontend(doc)["reasoning_parser"] = "REASONING_PARSER_XTML_THINK"
    return f"{F}.reasoning_parser"


@case
def recipient_header_without_atem_tools(doc):
    frontend(doc)["reasoning_parser"] = "REASONING_PARSER_RECIPIENT_HEADER"
    return f"{F}.reasoning_parser"


@case
def atem_tools_without_recipient_header(doc):
    frontend(doc)["tool_parser"] = "TOOL_PARSER_ATEM_RECIPIENT"
    return f"{F}.tool_parser"


@case
def terminal_marker_not_tool_opener(doc):
    frontend(doc)["reasoning_syntax"]["terminal_markers"] = ["<function="]
    return f"{F}.reasoning_syntax.terminal_markers[0]"


@case
def tool_syntax_missing(doc):
    del frontend(doc)["tool_syntax"]
    return f"{F}.tool_syntax"


@case
def tool_syntax_with_no_tool_parser(doc):
    frontend(doc)["tool_parser"] = "TOOL_PARSER_NONE"
    return f"{F}.tool_syntax"


@case
def reasoning_syntax_missing(doc):
    del frontend(doc)["reasoning_syntax"]
    return f"{F}.reasoning_syntax"


@case
def reasoning_token_outside_inputs(doc):
    frontend(doc)["reasoning_syntax"]["close_token_id"] = 130000
    return f"{F}.reasoning_syntax.close_token_id"


@case
def recipient_marker_without_recipient_reasoning(doc):
    frontend(doc)["assistant_boundary"]["recipient_prefix"] = " to="
    return f"{F}.assistant_boundary.recipient_prefix"


@case
def recipient_frames_incomplete(doc):
    fe = frontend(doc)
    fe["tool_parser"] = "TOOL_PARSER_ATEM_RECIPIENT"
    fe["reasoning_parser"] = "REASONING_PARSER_RECIPIENT_HEADER"
    fe["tool_syntax"]["opener"] = "<atem:function_calls>"
    del fe["reasoning_syntax"]
    fe["assistant_boundary"].update(recipient_prefix=" to=", header_end="<|message|>", self_recipient="self",
                                     generic_tool_recipient="functions", visible_recipients=["user"])
    return f"{F}.assistant_boundary.internal_message_end"


HARMONY = dict(start_control="<|start|>", channel_control="<|channel|>", message_control="<|message|>",
               end_control="<|end|>", call_control="<|call|>", return_control="<|return|>",
               constrain_control="<|constrain|>", role="assistant", recipient_marker="to=",
               reasoning_channels=["analysis"], content_channels=["final", "commentary"], tool_namespace="functions.",
               final_channel="final", tool_channel="commentary", tool_content_type="json")


def _harmony(doc) -> dict:
    fe = frontend(doc)
    fe.update(tool_parser="TOOL_PARSER_HARMONY_CHANNELS", reasoning_parser="REASONING_PARSER_HARMONY_CHANNELS",
              channel_syntax=dict(HARMONY))
    del fe["tool_syntax"], fe["reasoning_syntax"]
    return fe


@case
def harmony_tools_without_harmony_reasoning(doc):
    _harmony(doc)["reasoning_parser"] = "REASONING_PARSER_NONE"
    return f"{F}.reasoning_parser"


@case
def harmony_with_tool_syntax(doc):
    _harmony(doc)["tool_syntax"] = {"opener": "<tool_call>"}
    return f"{F}.tool_syntax"


@case
def harmony_channel_syntax_missing(doc):
    del _harmony(doc)["channel_syntax"]
    return f"{F}.channel_syntax"


@case
def harmony_control_empty(doc):
    _harmony(doc)["channel_syntax"]["constrain_control"] = ""
    return f"{F}.channel_syntax.constrain_control"


@case
def harmony_final_channel_not_content(doc):
    _harmony(doc)["channel_syntax"]["final_channel"] = "analysis"
    return f"{F}.channel_syntax.final_channel"


@case
def channel_syntax_without_harmony(doc):
    frontend(doc)["channel_syntax"] = dict(HARMONY)
    return f"{F}.channel_syntax"


@case
def duplicate_prefix_boundary_role(doc):
    frontend(doc)["prefix_boundaries"][1]["role"] = "MESSAGE_ROLE_SYSTEM"
    return f"{F}.prefix_boundaries[1].role"


@case
def image_preparation_none_with_vision(doc):
    frontend(doc)["image_preparation"] = "IMAGE_PREPARATION_NONE"
    return f"{F}.image_preparation"


@case
def image_layout_on_text_only_contract(doc):
    del model(doc)["vision"]
    return f"{F}.image_preparation"


@case
def merge_size_disagrees_with_vision(doc):
    frontend(doc)["image_preparation_data"]["merge_size"] = 3
    return f"{F}.image_preparation_data.merge_size"


@case
def zero_normalization_std(doc):
    frontend(doc)["image_preparation_data"]["std"][1] = 0
    return f"{F}.image_preparation_data.std[1]"


@case
def layout_feature_id_not_a_sentinel(doc):
    frontend(doc)["image_layout_data"]["feature_ids"] = [128257]
    return f"{F}.image_layout_data.feature_ids[0]"


@case
def empty_atomic_span(doc):
    frontend(doc)["image_layout_data"]["atomic_spans"][0] = {}
    return f"{F}.image_layout_data.atomic_spans[0].token_ids"


@case
def unspecified_tool_parser(doc):
    frontend(doc)["tool_parser"] = "TOOL_PARSER_UNSPECIFIED"
    return f"{F}.tool_parser"


@case
def unknown_tool_parser_name(doc):
    frontend(doc)["tool_parser"] = "TOOL_PARSER_MAGIC"
    return f"{F}.tool_parser"


@case
def unknown_tool_parser_number(doc):
    frontend(doc)["tool_parser"] = 99
    return f"{F}.tool_parser"


