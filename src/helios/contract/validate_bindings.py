"""Graph-local ValueBinding rules: destinations, source/operation and source/indexing
agreement, constant and image-output fields, and the speculative length source.
Registration of destinations in the manifest is checked in validate_cross.py.
"""

from __future__ import annotations

from helios.contract import serving_pb2 as spb
from helios.contract.binding_rules import (
    ALLOWED_INDEXING,
    IMAGE_SOURCES,
    LENGTH_SOURCES,
    LOGIT_BIAS_SOURCES,
    SOURCE_OPERATIONS,
    VISION_SOURCES,
)
from helios.contract.rules import enum_label, fail, op_label, require, source_label


def check_bindings(graph: spb.GraphContract, path: str, model: spb.ModelContract) -> None:
    first_use: dict[str, int] = {}
    for j, binding in enumerate(graph.bindings):
        item = f"{path}.bindings[{j}]"
        destination = binding.destination
        require(destination != "", f"{item}.destination", "destination is empty")
        if destination in first_use:
            fail(
                f"{item}.destination",
                f"destination {destination!r} is bound twice in this graph (first at bindings[{first_use[destination]}])",
            )
        first_use[destination] = j
        _check_source(graph.operation, binding, item, model)
    if graph.operation == spb.GRAPH_OPERATION_SPECULATIVE:
        _check_length_source(graph, path)
    _check_logit_bias(graph, path)


def _check_source(operation: int, binding: spb.ValueBinding, path: str, model: spb.ModelContract) -> None:
    source = binding.source
    label = source_label(source)
    if operation == spb.GRAPH_OPERATION_TUNING:
        require(source == spb.VALUE_SOURCE_CONSTANT, f"{path}.source", "tuning producers bind only CONSTANT values")
    if operation == spb.GRAPH_OPERATION_VISION:
        require(source in VISION_SOURCES, f"{path}.source", "VISION graphs bind only IMAGE_TENSOR and CONSTANT values")
    operations = SOURCE_OPERATIONS.get(source)
    if operations is not None and operation != spb.GRAPH_OPERATION_TUNING:
        require(operation in operations, f"{path}.source", f"{label} values are not supplied to {op_label(operation)} graphs")
    allowed = ALLOWED_INDEXING[source]
    require(
        binding.indexing in allowed,
        f"{path}.indexing",
        f"{label} cannot use {enum_label(spb.Indexing, binding.indexing)} indexing "
        f"(allowed: {', '.join(sorted(enum_label(spb.Indexing, i) for i in allowed))})",
    )
    if source != spb.VALUE_SOURCE_CONSTANT:
        require(binding.constant == 0, f"{path}.constant", "only CONSTANT bindings declare a value")
    if source in IMAGE_SOURCES:
        require(model.HasField("vision"), f"{path}.source", f"{label} needs a vision contract")
    if source == spb.VALUE_SOURCE_IMAGE_TENSOR:
        outputs = model.frontend.image_layout_data.outputs
        require(binding.image_output != "", f"{path}.image_output", "IMAGE_TENSOR names a layout output")
        require(
            binding.image_output in outputs,
            f"{path}.image_output",
            f"{binding.image_output!r} is not an output of the selected image layout",
        )
    else:
        require(binding.image_output == "", f"{path}.image_output", "only IMAGE_TENSOR bindings name a layout output")
    if source == spb.VALUE_SOURCE_HOST_TABLE_ROWS:
        tables = {table.name for table in model.host_tables}
        require(binding.host_table in tables, f"{path}.host_table",
                f"{binding.host_table!r} is not a declared host staging table")
    else:
        require(binding.host_table == "", f"{path}.host_table", "only HOST_TABLE_ROWS bindings name a host table")


def _check_length_source(graph: spb.GraphContract, path: str) -> None:
    found = [j for j, b in enumerate(graph.bindings) if b.source in LENGTH_SOURCES]
    if not found:
        fail(
            f"{path}.bindings",
            "a SPECULATIVE graph binds exactly one length source (QUERY_LENGTH or SPECULATIVE_PREFIX_LIMIT); found none",
        )
    if len(found) > 1:
        fail(
            f"{path}.bindings[{found[1]}].source",
            f"a SPECULATIVE graph binds exactly one length source; bindings[{found[0]}] already is one",
        )


def _check_logit_bias(graph: spb.GraphContract, path: str) -> None:
    """A graph that binds a request's logit-bias ids binds their values too, and the reverse (the
    runtime then applies a lane's bias in that graph; one without the other could not be applied)."""
    bound = {b.source for b in graph.bindings}
    ids, values = (source in bound for source in LOGIT_BIAS_SOURCES)
    if ids != values:
        have, missing = (source_label(s) for s in (LOGIT_BIAS_SOURCES if ids else LOGIT_BIAS_SOURCES[::-1]))
        fail(f"{path}.bindings", f"a graph that binds {have} also binds {missing}; found only {have}")


def length_source(graph: spb.GraphContract) -> int | None:
    """The graph's speculative length source, or None when it binds none."""
    for binding in graph.bindings:
        if binding.source in LENGTH_SOURCES:
            return binding.source
    return None
