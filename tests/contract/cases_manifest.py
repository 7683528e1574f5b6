"""Invalid documents, one per rule, for the execution manifest and for the rules that join it
with the serving contract (destinations, views, regions, catalogs, handles, tuned bindings).
"""

from __future__ import annotations

from contract.documents import binding, buffer, graph, model, named, state_view

CASES = []
C = "manifest.completion"


def case(fn):
    CASES.append(fn)
    return fn


def manifest(doc):
    return doc["manifest"]


def field(doc, kind):
    return named(manifest(doc)["completion"]["fields"], "kind", f"COMPLETION_FIELD_KIND_{kind}", f"{C}.fields")


def catalog(doc, name):
    return named(manifest(doc)["execution_catalog"], "graph", name, "manifest.execution_catalog")


def set_tuned(doc, name):
    """Point decode's tuned binding and the producer's catalog outputs at buffer `name`."""
    entry, path = graph(doc, "decode")
    entry["tuned_bindings"][0]["buffer"] = name
    manifest(doc)["tuning_catalog"][0]["outputs"] = [name]
    return f"{path}.tuned_bindings[0].buffer"


@case
def unsupported_manifest_version(doc):
    manifest(doc)["version"] = 2
    return "manifest.version"


@case
def zero_ranks(doc):
    del manifest(doc)["ranks"]
    return "manifest.ranks"


@case
def duplicate_buffer(doc):
    manifest(doc)["buffers"][1]["name"] = "w.embed"
    return "manifest.buffers[1].name"


@case
def empty_shape(doc):
    manifest(doc)["buffers"][0]["shape"] = []
    return "manifest.buffers[0].shape"


@case
def zero_dimension(doc):
    manifest(doc)["buffers"][0]["shape"][0] = {"size": "0"}
    return "manifest.buffers[0].shape[0].size"


@case
def dimension_without_size_or_extent(doc):
    manifest(doc)["buffers"][0]["shape"][0] = {}
    return "manifest.buffers[0].shape[0]"


@case
def load_extent_on_input(doc):
    entry, path = buffer(doc, "in.slots")
    entry["shape"][0] = {"load_extent": "LOAD_EXTENT_STATE_ROWS"}
    return f"{path}.shape[0].load_extent"


@case
def unspecified_dtype(doc):
    entry, path = buffer(doc, "in.slots")
    entry["dtype"] = "DTYPE_UNSPECIFIED"
    return f"{path}.dtype"


@case
def weight_without_resource(doc):
    del manifest(doc)["buffers"][0]["resource_id"]
    return "manifest.buffers[0].resource_id"


@case
def resource_on_non_weight(doc):
    entry, path = buffer(doc, "in.slots")
    entry["resource_id"] = "weights/rank0/slots"
    return f"{path}.resource_id"


@case
def cache_storage_on_host(doc):
    entry, path = buffer(doc, "cache.keys")
    entry["placement"] = "PLACEMENT_HOST"
    return f"{path}.placement"


@case
def destination_to_unknown_buffer(doc):
    manifest(doc)["destinations"][0]["buffer"] = "in.nothing"
    return "manifest.destinations[0].buffer"


@case
def destination_to_non_input_buffer(doc):
    manifest(doc)["destinations"][0]["buffer"] = "state.global"
    return "manifest.destinations[0].buffer"


@case
def duplicate_destination(doc):
    manifest(doc)["destinations"][1]["name"] = manifest(doc)["destinations"][0]["name"]
    return "manifest.destinations[1].name"


@case
def handle_rank_out_of_range(doc):
    manifest(doc)["graph_handles"][0]["rank"] = 1
    return "manifest.graph_handles[0].rank"


@case
def handle_without_program(doc):
    del manifest(doc)["graph_handles"][0]["resource_id"]
    return "manifest.graph_handles[0].resource_id"


@case
def duplicate_handle(doc):
    handles = manifest(doc)["graph_handles"]
    handles.append(dict(handles[0], resource_id="programs/rank0/other"))
    return f"manifest.graph_handles[{len(handles) - 1}]"


@case
def handle_for_undeclared_variant(doc):
    manifest(doc)["graph_handles"][0]["capacity"]["batch_capacity"] = 32
    return "manifest.graph_handles[0].capacity"


@case
def handle_for_unknown_graph(doc):
    manifest(doc)["graph_handles"][0]["graph"] = "warmup"
    return "manifest.graph_handles[0].graph"


@case
def missing_graph_variant(doc):
    handles = manifest(doc)["graph_handles"]
    handles[:] = [h for h in handles if not (h["graph"] == "decode" and h["capacity"]["batch_capacity"] == 32)]
    return graph(doc, "decode")[1] + ".variants[2]"


@case
def missing_rank(doc):
    manifest(doc)["ranks"] = 2
    return "contract.model.graphs[0].variants[0]"


@case
def operation_disagrees_with_catalog(doc):
    catalog(doc, "decode")[0]["operation"] = "GRAPH_OPERATION_PREFILL"
    return graph(doc, "decode")[1] + ".operation"


@case
def graph_missing_from_execution_catalog(doc):
    entries = manifest(doc)["execution_catalog"]
    entries.remove(catalog(doc, "mixed")[0])
    return graph(doc, "mixed")[1] + ".operation"


@case
def catalog_names_unknown_graph(doc):
    manifest(doc)["execution_catalog"].append({"graph": "warmup", "operation": "GRAPH_OPERATION_DECODE"})
    return f"manifest.execution_catalog[{len(manifest(doc)['execution_catalog']) - 1}].graph"


@case
def duplicate_catalog_entry(doc):
    manifest(doc)["execution_catalog"].append(dict(manifest(doc)["execution_catalog"][0]))
    return f"manifest.execution_catalog[{len(manifest(doc)['execution_catalog']) - 1}].graph"


@case
def producer_in_both_catalogs(doc):
    manifest(doc)["execution_catalog"].append({"graph": "tune_attention", "operation": "GRAPH_OPERATION_TUNING"})
    return "manifest.tuning_catalog[0].graph"


@case
def tuning_graph_missing_from_tuning_catalog(doc):
    manifest(doc)["tuning_catalog"] = []
    return graph(doc, "tune_attention")[1] + ".operation"


@case
def tuning_catalog_names_unknown_graph(doc):
    manifest(doc)["tuning_catalog"].append({"graph": "tune_mlp", "outputs": ["tuning.attention_splits"]})
    return "manifest.tuning_catalog[1].graph"


@case
def tuning_output_unknown(doc):
    manifest(doc)["tuning_catalog"][0]["outputs"] = ["tuning.splits"]
    return "manifest.tuning_catalog[0].outputs[0]"


@case
def tuning_producer_without_outputs(doc):
    manifest(doc)["tuning_catalog"][0]["outputs"] = []
    return "manifest.tuning_catalog[0].outputs"


@case
def missing_completion_layout(doc):
    del manifest(doc)["completion"]
    return C


@case
def one_completion_frame(doc):
    manifest(doc)["completion"]["frames"] = 1
    return f"{C}.frames"


@case
def completion_buffer_unknown(doc):
    manifest(doc)["completion"]["buffer"] = "out.records"
    return f"{C}.buffer"


@case
def completion_buffer_not_output(doc):
    buffer(doc, "out.completion")[0]["role"] = "BUFFER_ROLE_SCRATCH"
    return f"{C}.buffer"


@case
def completion_buffer_shape_disagrees(doc):
    manifest(doc)["completion"]["record_bytes"] = 96
    return f"{C}.buffer"


@case
def completion_rows_below_graph_rows(doc):
    buffer(doc, "out.completion")[0]["shape"][1] = {"size": "32"}
    return f"{C}.buffer"


@case
def duplicate_completion_field(doc):
    entry, path = field(doc, "GENERATION")
    entry["kind"] = "COMPLETION_FIELD_KIND_SLOT"
    return f"{path}.kind"


@case
def float_completion_field(doc):
    entry, path = field(doc, "GENERATION")
    entry["dtype"] = "DTYPE_FLOAT32"
    return f"{path}.dtype"


@case
def misaligned_completion_field(doc):
    entry, path = field(doc, "DRAFT_CURSOR")
    entry["byte_offset"] = 20
    return f"{path}.byte_offset"


@case
def completion_field_past_record(doc):
    entry, path = field(doc, "SAMPLED_TOKENS")
    entry["count"] = 20
    return f"{path}.count"


@case
def overlapping_completion_fields(doc):
    entry, path = field(doc, "GENERATION")
    entry["byte_offset"] = 0
    return f"{path}.byte_offset"


@case
def missing_reserved_model_field(doc):
    fields = manifest(doc)["completion"]["fields"]
    fields.remove(field(doc, "RESERVED_MODEL")[0])
    return f"{C}.fields"


@case
def sampled_tokens_below_lane_limit(doc):
    field(doc, "SAMPLED_TOKENS")[0]["count"] = 2
    return f"{C}.fields"


@case
def confidence_buffer_missing(doc):
    del manifest(doc)["completion"]["confidence_buffer"]
    return f"{C}.confidence_buffer"


@case
def confidence_capacity_below_width(doc):
    buffer(doc, "out.confidence")[0]["shape"][2] = {"size": "6"}
    return f"{C}.confidence_buffer"


@case
def confidence_not_fp32(doc):
    buffer(doc, "out.confidence")[0]["dtype"] = "DTYPE_BFLOAT16"
    return f"{C}.confidence_buffer"


# -- cross-document ------------------------------------------------------------------------
@case
def binding_to_unregistered_destination(doc):
    entry, path = binding(doc, "decode", "slots")
    entry["destination"] = "slot_ids"
    return f"{path}.destination"


@case
def page_table_source_to_plain_destination(doc):
    entry, path = binding(doc, "decode", "slots")
    entry.update(source="VALUE_SOURCE_PAGE_TABLE", indexing="INDEXING_PHYSICAL_REQUEST_ROW")
    return f"{path}.source"


@case
def plain_source_to_page_table_view(doc):
    entry, path = binding(doc, "decode", "page_table")
    entry.update(source="VALUE_SOURCE_GENERATION")
    return f"{path}.source"


@case
def integer_source_into_float_destination(doc):
    buffer(doc, "in.slots")[0]["dtype"] = "DTYPE_FLOAT32"
    return binding(doc, "prefill", "slots")[1] + ".destination"


@case
def sampling_parameters_into_integer_destination(doc):
    buffer(doc, "in.sampling_params")[0]["dtype"] = "DTYPE_INT32"
    return binding(doc, "initialize", "sampling_params")[1] + ".destination"


@case
def page_table_view_unregistered(doc):
    model(doc)["cache"]["page_table_views"][0]["destination"] = "pages"
    return "contract.model.cache.page_table_views[0].destination"


@case
def page_table_view_on_unpaged_region(doc):
    model(doc)["cache"]["page_table_views"][0]["region"] = "continuation"
    return "contract.model.cache.page_table_views[0].region"


@case
def page_table_view_unknown_region(doc):
    model(doc)["cache"]["page_table_views"][0]["region"] = "kv"
    return "contract.model.cache.page_table_views[0].region"


@case
def page_table_too_narrow_for_offset(doc):
    buffer(doc, "in.draft_page_table")[0]["shape"][1] = {"size": "512"}
    return "contract.model.cache.page_table_views[1].destination"


@case
def state_view_unknown_buffer(doc):
    state_view(doc, "pending_token")[0]["buffer"] = "state.request"
    return "contract.model.state_views[0].buffer"


@case
def state_view_outside_persistent_state(doc):
    state_view(doc, "pending_token")[0]["buffer"] = "cache.continuation"
    return "contract.model.state_views[0].buffer"


@case
def state_view_outside_its_row(doc):
    state_view(doc, "request_counters")[0]["byte_extent"] = "17"
    return state_view(doc, "request_counters")[1] + ".byte_extent"


@case
def state_view_stride_differs_from_row(doc):
    state_view(doc, "pending_token")[0]["row_stride"] = "16"
    return "contract.model.state_views[0].row_stride"


@case
def whole_buffer_view_outside_buffer(doc):
    state_view(doc, "step_counter")[0]["byte_offset"] = "32"
    return state_view(doc, "step_counter")[1] + ".byte_extent"


@case
def whole_buffer_view_of_load_time_buffer(doc):
    del state_view(doc, "pending_token")[0]["row_stride"]
    return "contract.model.state_views[0].row_stride"


@case
def region_plane_unknown(doc):
    model(doc)["cache"]["regions"][0]["planes"][0] = "cache.k"
    return "contract.model.cache.regions[0].planes[0]"


@case
def region_plane_not_cache_storage(doc):
    model(doc)["cache"]["regions"][0]["planes"][0] = "state.global"
    return "contract.model.cache.regions[0].planes[0]"


@case
def plane_in_two_regions(doc):
    model(doc)["cache"]["regions"][2]["planes"].append("cache.keys")
    return "contract.model.cache.regions[2].planes[1]"


@case
def paged_plane_without_page_extent(doc):
    buffer(doc, "cache.keys")[0]["shape"][1] = {"size": "16384"}
    return "contract.model.cache.regions[0].planes[0]"


@case
def cache_storage_outside_regions(doc):
    manifest(doc)["buffers"].append(dict(buffer(doc, "cache.keys")[0], name="cache.spare"))
    return f"manifest.buffers[{len(manifest(doc)['buffers']) - 1}].role"


@case
def cursor_unknown_region(doc):
    model(doc)["cache"]["cursors"][0]["region"] = "draft_kv"
    return "contract.model.cache.cursors[0].region"


@case
def dependency_on_unknown_buffer(doc):
    entry, path = graph(doc, "decode")
    entry["resource_dependencies"][0] = "w.embedding"
    return f"{path}.resource_dependencies[0]"


@case
def dependency_on_non_weight(doc):
    entry, path = graph(doc, "decode")
    entry["resource_dependencies"][0] = "state.global"
    return f"{path}.resource_dependencies[0]"


@case
def tuned_producer_missing_from_tuning_catalog(doc):
    entry, path = graph(doc, "decode")
    entry["tuned_bindings"][0]["producer"] = "tune_mlp"
    return f"{path}.tuned_bindings[0].producer"


@case
def tuned_buffer_not_a_producer_output(doc):
    entry, path = graph(doc, "decode")
    entry["tuned_bindings"][0]["buffer"] = "state.global"
    return f"{path}.tuned_bindings[0].buffer"


@case
def tuned_buffer_overlaps_request_inputs(doc):
    return set_tuned(doc, "in.slots")


@case
def tuned_buffer_overlaps_cache_storage(doc):
    return set_tuned(doc, "cache.continuation")


@case
def tuned_buffer_overlaps_writable_state(doc):
    return set_tuned(doc, "state.global")


@case
def tuned_buffer_is_scratch(doc):
    return set_tuned(doc, "scratch.workspace")


@case
def tuning_output_overlaps_cache_storage(doc):
    manifest(doc)["tuning_catalog"][0]["outputs"].append("cache.continuation")
    return "manifest.tuning_catalog[0].outputs[1]"


# -- semantic JSON -----------------------------------------------------------------------------
@case
def unknown_top_level_field(doc):
    doc["signature"] = "abc"
    return "signature"


@case
def missing_manifest(doc):
    del doc["manifest"]
    return "manifest"


@case
def unknown_contract_field(doc):
    doc["contract"]["served_name"] = "x"
    return "contract.served_name"


@case
def unknown_nested_field(doc):
    entry, path = binding(doc, "decode", "slots")
    entry["sauce"] = "SLOT"
    return f"{path}.sauce"


@case
def camel_case_field_name(doc):
    doc["contract"]["servedId"] = doc["contract"].pop("served_id")
    return "contract.servedId"


@case
def string_where_integer_expected(doc):
    model(doc)["version"] = "three"
    return "contract.model.version"


@case
def null_value(doc):
    doc["contract"]["context_tokens"] = None
    return "contract.context_tokens"


@case
def negative_unsigned_integer(doc):
    doc["contract"]["context_tokens"] = -1
    return "contract.context_tokens"


@case
def object_where_array_expected(doc):
    doc["contract"]["aliases"] = "default"
    return "contract.aliases"


@case
def both_oneof_members(doc):
    manifest(doc)["buffers"][0]["shape"][0]["load_extent"] = "LOAD_EXTENT_PHYSICAL_PAGES"
    return "manifest.buffers[0].shape[0].load_extent"


@case
def abi_operation_unqualified(doc):
    manifest(doc)["abi_operations"][0]["name"] = "paged_attention"
    return "manifest.abi_operations[0].name"


@case
def abi_operation_duplicate(doc):
    ops = manifest(doc)["abi_operations"]
    ops[1]["name"] = ops[0]["name"]
    return "manifest.abi_operations[1].name"


@case
def abi_operation_without_schema(doc):
    manifest(doc)["abi_operations"][0]["schema"] = ""
    return "manifest.abi_operations[0].schema"


@case
def handle_names_undeclared_op(doc):
    manifest(doc)["graph_handles"][2]["abi_operations"][1] = "helios::missing"
    return "manifest.graph_handles[2].abi_operations[1]"


def decode_handle(doc):
    handles = manifest(doc)["graph_handles"]
    index = next(i for i, h in enumerate(handles) if h["graph"] == "decode")
    return handles[index], f"manifest.graph_handles[{index}]"


@case
def program_input_unknown_buffer(doc):
    handle, path = decode_handle(doc)
    handle["program_inputs"][1] = "in.missing"
    return f"{path}.program_inputs[1]"


@case
def program_input_repeated(doc):
    handle, path = decode_handle(doc)
    handle["program_inputs"][2] = handle["program_inputs"][0]
    return f"{path}.program_inputs[2]"


@case
def program_input_is_a_weight(doc):
    handle, path = decode_handle(doc)
    weight = next(b["name"] for b in manifest(doc)["buffers"] if b["role"] == "BUFFER_ROLE_WEIGHT")
    handle["program_inputs"][0] = weight
    return f"{path}.program_inputs[0]"


@case
def program_output_not_output_role(doc):
    handle, path = decode_handle(doc)
    handle["program_outputs"][0] = "in.slots"
    return f"{path}.program_outputs[0]"


@case
def submission_input_unknown(doc):
    manifest(doc)["completion"]["submission_input"] = "in.nothing"
    return f"{C}.submission_input"


@case
def submission_input_not_scalar_int64(doc):
    manifest(doc)["completion"]["submission_input"] = "in.slots"
    return f"{C}.submission_input"


def _window_region(doc, region_index: int = 1, extent: str = "LOAD_EXTENT_WINDOW_PAGES"):
    """Make the draft region a sliding window whose planes are sized by `extent`."""
    region = model(doc)["cache"]["regions"][region_index]
    region["kind"] = "HISTORY_KIND_SLIDING_WINDOW"
    region["window_tokens"] = 128
    for plane in region["planes"]:
        entry, _ = buffer(doc, plane)
        entry["shape"] = [{"load_extent": extent} if "load_extent" in dim else dim for dim in entry["shape"]]
    return region


@case
def window_extent_on_key_value_plane(doc):
    entry, _ = buffer(doc, "cache.keys")
    entry["shape"][1] = {"load_extent": "LOAD_EXTENT_WINDOW_PAGES"}
    return "contract.model.cache.regions[0].planes[0]"


@case
def window_region_without_its_own_view(doc):
    _window_region(doc)
    model(doc)["cache"]["page_table_views"][1]["region"] = "attention"
    return "contract.model.cache.regions[1].planes[0]"


@case
def sliding_plane_sized_by_state_rows(doc):
    _window_region(doc, extent="LOAD_EXTENT_STATE_ROWS")
    return "contract.model.cache.regions[1].planes[0]"
