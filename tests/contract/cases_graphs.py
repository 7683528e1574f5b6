"""Invalid contracts, one per rule, for GraphContract: variants and speculative extents,
bindings, state accesses, pending tokens, cursors, tuned bindings and version gates.
"""

from __future__ import annotations

from contract.documents import access, binding, graph, model

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def variant(doc, name, index=0):
    entry, path = graph(doc, name)
    return entry["variants"][index], f"{path}.variants[{index}]"


def add_binding(doc, name, destination, source, indexing, **extra):
    entry, path = graph(doc, name)
    entry["bindings"].append(
        {"destination": destination, "source": f"VALUE_SOURCE_{source}", "indexing": f"INDEXING_{indexing}", **extra}
    )
    return f"{path}.bindings[{len(entry['bindings']) - 1}]"


@case
def duplicate_graph_name(doc):
    entry, path = graph(doc, "score_prefill")
    entry["name"] = "prefill"
    return f"{path}.name"


@case
def empty_graph_name(doc):
    entry, path = graph(doc, "score_prefill")
    entry["name"] = ""
    return f"{path}.name"


@case
def no_variants(doc):
    entry, path = graph(doc, "prefill")
    entry["variants"] = []
    return f"{path}.variants"


@case
def zero_batch_capacity(doc):
    entry, path = variant(doc, "decode")
    del entry["batch_capacity"]
    return f"{path}.batch_capacity"


@case
def packed_tokens_exceed_b_times_w(doc):
    entry, path = variant(doc, "decode")
    entry["packed_token_capacity"] = 2
    return f"{path}.packed_token_capacity"


@case
def packed_tokens_below_needed(doc):
    entry, path = variant(doc, "speculate_w4")
    entry["packed_token_capacity"] = 16
    return f"{path}.packed_token_capacity"


@case
def proposals_on_decode(doc):
    entry, path = variant(doc, "decode")
    entry["draft_tokens"] = 1
    return f"{path}.draft_tokens"


@case
def lane_limit_above_width(doc):
    entry, path = variant(doc, "speculate_confident")
    entry["lane_limit"] = 5
    return f"{path}.lane_limit"


@case
def lane_limit_above_drafts_plus_one(doc):
    entry, path = variant(doc, "speculate_w4")
    entry.update(token_capacity=8, packed_token_capacity=256, lane_limit=5)
    return f"{path}.lane_limit"


@case
def lane_limit_zero(doc):
    entry, path = variant(doc, "speculate_w4")
    del entry["lane_limit"]
    return f"{path}.lane_limit"


@case
def confidence_width_differs_from_drafts(doc):
    entry, path = variant(doc, "speculate_confident")
    entry["confidence_width"] = 6
    return f"{path}.confidence_width"


@case
def prefix_limit_program_without_confidence(doc):
    entry, path = variant(doc, "speculate_confident")
    del entry["confidence_width"]
    return f"{path}.confidence_width"


@case
def width_one_program_draws_proposals(doc):
    entry, path = variant(doc, "speculate_w1")
    entry["draft_tokens"] = 1
    return f"{path}.draft_tokens"


@case
def zero_length_sources(doc):
    entry, path = graph(doc, "speculate_w4")
    entry["bindings"].remove(binding(doc, "speculate_w4", "query_lengths")[0])
    return f"{path}.bindings"


@case
def two_length_sources(doc):
    return add_binding(doc, "speculate_w4", "prefix_limits", "SPECULATIVE_PREFIX_LIMIT", "ACTIVE_ROW") + ".source"


@case
def logit_bias_ids_without_values(doc):
    add_binding(doc, "speculate_w4", "logit_bias_ids", "LOGIT_BIAS_IDS", "PHYSICAL_REQUEST_ROW")
    return graph(doc, "speculate_w4")[1] + ".bindings"


@case
def logit_bias_values_without_ids(doc):
    add_binding(doc, "decode", "logit_bias_values", "LOGIT_BIAS_VALUES", "PHYSICAL_REQUEST_ROW")
    return graph(doc, "decode")[1] + ".bindings"


@case
def logit_bias_per_submission_row(doc):
    path = add_binding(doc, "speculate_w4", "logit_bias_ids", "LOGIT_BIAS_IDS", "SUBMISSION_ROW")
    add_binding(doc, "speculate_w4", "logit_bias_values", "LOGIT_BIAS_VALUES", "PHYSICAL_REQUEST_ROW")
    return f"{path}.indexing"


@case
def duplicate_destination_in_graph(doc):
    return add_binding(doc, "decode", "slots", "SLOT", "ACTIVE_ROW") + ".destination"


@case
def empty_destination(doc):
    return add_binding(doc, "decode", "", "SLOT", "ACTIVE_ROW") + ".destination"


@case
def source_not_supplied_to_operation(doc):
    return add_binding(doc, "decode", "prompt_tokens", "PROMPT_TOKENS", "PACKED_TOKEN") + ".source"


@case
def indexing_not_allowed_for_source(doc):
    entry, path = binding(doc, "prefill", "prompt_tokens")
    entry["indexing"] = "INDEXING_SUBMISSION_ROW"
    return f"{path}.indexing"


@case
def unspecified_indexing(doc):
    entry, path = binding(doc, "prefill", "prompt_tokens")
    entry["indexing"] = "INDEXING_UNSPECIFIED"
    return f"{path}.indexing"


@case
def unspecified_source(doc):
    entry, path = binding(doc, "prefill", "prompt_tokens")
    entry["source"] = "VALUE_SOURCE_UNSPECIFIED"
    return f"{path}.source"


@case
def constant_on_non_constant_source(doc):
    entry, path = binding(doc, "prefill", "prompt_tokens")
    entry["constant"] = "3"
    return f"{path}.constant"


@case
def image_tensor_names_unknown_output(doc):
    entry, path = binding(doc, "prefill", "pixel_patches")
    entry["image_output"] = "pixels"
    return f"{path}.image_output"


@case
def image_output_on_non_image_source(doc):
    entry, path = binding(doc, "prefill", "prompt_tokens")
    entry["image_output"] = "pixel_patches"
    return f"{path}.image_output"


@case
def image_source_without_vision(doc):
    mdl = model(doc)
    del mdl["vision"]
    fe = mdl["frontend"]
    fe.update(image_preparation="IMAGE_PREPARATION_NONE", image_layout="IMAGE_LAYOUT_NONE")
    del fe["image_preparation_data"], fe["image_layout_data"]
    for entry in graph(doc, "prefill")[0]["variants"]:
        del entry["patch_capacity"]
    return binding(doc, "prefill", "image_feature_indices")[1] + ".source"


@case
def variant_patch_capacity_not_captured(doc):
    entry, path = variant(doc, "prefill")
    entry["patch_capacity"] = 2048
    return f"{path}.patch_capacity"


@case
def duplicate_variant(doc):
    entry, path = graph(doc, "decode")
    entry["variants"][1] = dict(entry["variants"][0])
    return f"{path}.variants[1]"


@case
def tuning_graph_binds_host_values(doc):
    entry, path = binding(doc, "tune_attention", "layer_count")
    entry.update(source="VALUE_SOURCE_LIVE_ROW_COUNT")
    del entry["constant"]
    return f"{path}.source"


@case
def tuning_graph_accesses_state(doc):
    entry, path = graph(doc, "tune_attention")
    entry["state_accesses"] = [{"view": "step_counter", "mode": "ACCESS_MODE_READ"}]
    return f"{path}.state_accesses"


@case
def tuned_bindings_before_version_3(doc):
    model(doc)["version"] = 2
    return graph(doc, "decode")[1] + ".tuned_bindings"


@case
def speculative_graph_before_version_3(doc):
    model(doc)["version"] = 2
    for entry in model(doc)["graphs"]:
        entry.pop("tuned_bindings", None)
    return graph(doc, "speculate_w1")[1] + ".operation"


@case
def unknown_operation_number(doc):
    graph(doc, "decode")[0]["operation"] = 42
    return graph(doc, "decode")[1] + ".operation"


@case
def access_to_unknown_view(doc):
    entry, path = access(doc, "decode", "rng_counter")
    entry["view"] = "rng"
    return f"{path}.view"


@case
def view_accessed_twice(doc):
    entry, path = access(doc, "decode", "rng_counter")
    entry["view"] = "pending_token"
    return f"{path}.view"


@case
def unspecified_access_mode(doc):
    entry, path = access(doc, "decode", "rng_counter")
    entry["mode"] = "ACCESS_MODE_UNSPECIFIED"
    return f"{path}.mode"


@case
def row_state_without_state_rows(doc):
    entry, path = graph(doc, "decode")
    del entry["state_rows_per_request"]
    return f"{path}.state_rows_per_request"


@case
def generation_graph_without_pending_token(doc):
    entry, path = graph(doc, "decode_host_fed")
    entry["bindings"].remove(binding(doc, "decode_host_fed", "pending_tokens")[0])
    return f"{path}.pending_token_view"


@case
def host_pending_token_beside_a_read_only_view(doc):
    entry, _ = access(doc, "decode", "pending_token")
    entry["mode"] = "ACCESS_MODE_READ"  # a graph that also takes the host's token must keep the view current
    return add_binding(doc, "decode", "pending_tokens", "PENDING_TOKEN", "ACTIVE_ROW") + ".source"


@case
def pending_view_on_prefill(doc):
    entry, path = graph(doc, "prefill")
    entry["pending_token_view"] = "pending_token"
    return f"{path}.pending_token_view"


@case
def pending_view_unknown(doc):
    entry, path = graph(doc, "decode")
    entry["pending_token_view"] = "pending"
    return f"{path}.pending_token_view"


@case
def pending_view_not_read(doc):
    access(doc, "decode", "pending_token")[0]["mode"] = "ACCESS_MODE_WRITE"
    return graph(doc, "decode")[1] + ".pending_token_view"


@case
def producer_does_not_write_pending_token(doc):
    access(doc, "prefill", "pending_token")[0]["mode"] = "ACCESS_MODE_READ"
    return graph(doc, "prefill")[1] + ".state_accesses"


@case
def unknown_draft_cursor(doc):
    entry, path = graph(doc, "decode")
    entry["draft_cursor"] = "drafts"
    return f"{path}.draft_cursor"


@case
def draft_cursor_on_prefill(doc):
    entry, path = graph(doc, "prefill")
    entry["draft_cursor"] = "draft"
    return f"{path}.draft_cursor"


@case
def tuned_buffer_bound_twice(doc):
    entry, path = graph(doc, "decode")
    entry["tuned_bindings"].append(dict(entry["tuned_bindings"][0]))
    return f"{path}.tuned_bindings[1].buffer"


@case
def tuned_binding_on_tuning_graph(doc):
    entry, path = graph(doc, "tune_attention")
    entry["tuned_bindings"] = [{"buffer": "tuning.attention_splits", "producer": "tune_attention"}]
    return f"{path}.tuned_bindings[0]"


@case
def duplicate_resource_dependency(doc):
    entry, path = graph(doc, "decode")
    entry["resource_dependencies"].append("w.embed")
    return f"{path}.resource_dependencies[{len(entry['resource_dependencies']) - 1}]"


@case
def no_decode_graph(doc):
    graphs = model(doc)["graphs"]
    graphs[:] = [g for g in graphs if g["operation"] != "GRAPH_OPERATION_DECODE"]
    return "contract.model.graphs"


@case
def vision_variant_without_patch_capacity(doc):
    entry, path = variant(doc, "encode_images")
    del entry["patch_capacity"]
    return f"{path}.patch_capacity"


@case
def vision_graph_binds_a_lane_source(doc):
    return add_binding(doc, "encode_images", "slots", "SLOT", "SUBMISSION_ROW") + ".source"


@case
def vision_graph_holds_request_rows(doc):
    entry, path = graph(doc, "encode_images")
    entry["state_rows_per_request"] = 1
    return f"{path}.state_rows_per_request"



# --- host staging tables (Engram) ---------------------------------------------------------------

@case
def host_rows_name_an_undeclared_table(doc):
    entry, path = binding(doc, "prefill", "engram_rows")
    entry["host_table"] = "missing"
    return f"{path}.host_table"


@case
def host_table_on_another_source(doc):
    entry, path = binding(doc, "prefill", "slots")
    entry["host_table"] = "engram"
    return f"{path}.host_table"


@case
def host_rows_into_a_speculative_graph(doc):
    return add_binding(doc, "speculate_w1", "engram_rows", "HOST_TABLE_ROWS", "PACKED_TOKEN",
                       host_table="engram") + ".source"


@case
def host_rows_with_a_device_owned_pending_token(doc):
    add_binding(doc, "decode", "engram_rows", "HOST_TABLE_ROWS", "PACKED_TOKEN", host_table="engram")
    return graph(doc, "decode")[1] + ".pending_token_view"


@case
def host_table_multiplier_count(doc):
    model(doc)["host_tables"][0]["multipliers"].pop()
    return "contract.model.host_tables[0].multipliers"


@case
def host_table_zero_multiplier(doc):
    model(doc)["host_tables"][0]["multipliers"][2] = "0"
    return "contract.model.host_tables[0].multipliers[2]"


@case
def host_table_ngram_too_long(doc):
    model(doc)["host_tables"][0]["ngram_tokens"] = 9
    return "contract.model.host_tables[0].ngram_tokens"


@case
def host_table_not_in_host_memory(doc):
    from contract.documents import buffer
    buffer(doc, "w.engram")[0]["placement"] = "PLACEMENT_DEVICE"
    return "contract.model.host_tables[0].table"


@case
def host_table_duplicate_name(doc):
    model(doc)["host_tables"].append(dict(model(doc)["host_tables"][0]))
    return "contract.model.host_tables[1].name"


@case
def host_rows_destination_of_another_width(doc):
    from contract.documents import buffer
    buffer(doc, "in.engram_rows")[0]["shape"][2] = {"size": "32"}
    return binding(doc, "prefill", "engram_rows")[1] + ".destination"
