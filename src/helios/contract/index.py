"""Name lookups over both documents, built once the names are known to be unique.

`build_index` enforces the uniqueness rules (every name nonempty, no duplicates) and returns
read-only maps from name to `(position, message)`, so later rules can point at the declaring
field by position. The maps reference the decoded messages; nothing here mutates them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.rules import GRAPHS, MANIFEST, MODEL, fail


class Named(NamedTuple):
    """A named entry and the path of the message declaring it."""

    path: str
    message: object


class ContractIndex(NamedTuple):
    """Read-only name maps of one contract and manifest pair."""

    graphs: Mapping[str, Named]
    state_views: Mapping[str, Named]
    regions: Mapping[str, Named]
    cursors: Mapping[str, Named]
    page_table_views: Mapping[str, Named]
    buffers: Mapping[str, Named]
    destinations: Mapping[str, Named]
    execution_catalog: Mapping[str, Named]
    tuning_catalog: Mapping[str, Named]


def unique_names(items, key: str, path: str, what: str) -> Mapping[str, Named]:
    """Map each item's `key` attribute to its entry; raise on an empty or repeated name."""
    seen: dict[str, Named] = {}
    for i, item in enumerate(items):
        name = getattr(item, key)
        item_path = f"{path}[{i}]"
        if not name:
            fail(f"{item_path}.{key}", f"{what} name is empty")
        if name in seen:
            fail(f"{item_path}.{key}", f"duplicate {what} {name!r} (first declared at {seen[name].path})")
        seen[name] = Named(item_path, item)
    return MappingProxyType(seen)


def build_index(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> ContractIndex:
    model = contract.model
    cache = model.cache
    return ContractIndex(
        graphs=unique_names(model.graphs, "name", GRAPHS, "graph"),
        state_views=unique_names(model.state_views, "name", f"{MODEL}.state_views", "state view"),
        regions=unique_names(cache.regions, "name", f"{MODEL}.cache.regions", "history region"),
        cursors=unique_names(cache.cursors, "name", f"{MODEL}.cache.cursors", "completion cursor"),
        page_table_views=unique_names(
            cache.page_table_views, "destination", f"{MODEL}.cache.page_table_views", "page-table view"
        ),
        buffers=unique_names(manifest.buffers, "name", f"{MANIFEST}.buffers", "buffer"),
        destinations=unique_names(
            manifest.destinations, "name", f"{MANIFEST}.destinations", "transport destination"
        ),
        execution_catalog=unique_names(
            manifest.execution_catalog, "graph", f"{MANIFEST}.execution_catalog", "execution catalog entry"
        ),
        tuning_catalog=unique_names(
            manifest.tuning_catalog, "graph", f"{MANIFEST}.tuning_catalog", "tuning catalog entry"
        ),
    )
