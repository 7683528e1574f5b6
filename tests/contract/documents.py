"""Helpers for tests: the example contract as a JSON document, lookups by name, decoding."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

from helios.contract import PreparedContract

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "contract.json"


@lru_cache(maxsize=1)
def example_text() -> str:
    return EXAMPLE.read_text()


@lru_cache(maxsize=1)
def _example_doc() -> dict:
    return json.loads(example_text())


def example_doc() -> dict:
    """A fresh, mutable copy of the example's semantic JSON document."""
    return copy.deepcopy(_example_doc())


def model(doc: dict) -> dict:
    return doc["contract"]["model"]


def graph(doc: dict, name: str) -> tuple[dict, str]:
    """The named graph and its path."""
    for i, entry in enumerate(model(doc)["graphs"]):
        if entry["name"] == name:
            return entry, f"contract.model.graphs[{i}]"
    raise KeyError(name)


def binding(doc: dict, graph_name: str, destination: str) -> tuple[dict, str]:
    entry, path = graph(doc, graph_name)
    for i, item in enumerate(entry["bindings"]):
        if item["destination"] == destination:
            return item, f"{path}.bindings[{i}]"
    raise KeyError(destination)


def access(doc: dict, graph_name: str, view: str) -> tuple[dict, str]:
    entry, path = graph(doc, graph_name)
    for i, item in enumerate(entry["state_accesses"]):
        if item["view"] == view:
            return item, f"{path}.state_accesses[{i}]"
    raise KeyError(view)


def named(items: list, key: str, name: str, path: str) -> tuple[dict, str]:
    for i, item in enumerate(items):
        if item.get(key) == name:
            return item, f"{path}[{i}]"
    raise KeyError(name)


def buffer(doc: dict, name: str) -> tuple[dict, str]:
    return named(doc["manifest"]["buffers"], "name", name, "manifest.buffers")


def state_view(doc: dict, name: str) -> tuple[dict, str]:
    return named(model(doc)["state_views"], "name", name, "contract.model.state_views")


def handles_of(doc: dict, graph_name: str) -> list[dict]:
    return [h for h in doc["manifest"]["graph_handles"] if h["graph"] == graph_name]


def decode_doc(doc: dict) -> PreparedContract:
    return PreparedContract.from_json(json.dumps(doc))


def drop_graphs(doc: dict, operations: set[str]) -> None:
    """Remove every graph with one of `operations`, with its handles and catalog entries."""
    names = {g["name"] for g in model(doc)["graphs"] if g["operation"] in operations}
    model(doc)["graphs"] = [g for g in model(doc)["graphs"] if g["name"] not in names]
    manifest = doc["manifest"]
    manifest["graph_handles"] = [h for h in manifest["graph_handles"] if h["graph"] not in names]
    manifest["execution_catalog"] = [e for e in manifest["execution_catalog"] if e["graph"] not in names]
    manifest["tuning_catalog"] = [e for e in manifest["tuning_catalog"] if e["graph"] not in names]


def version_2_doc() -> dict:
    """The example reduced to what contract version 2 can express (no speculation, no tuning, no VISION graph)."""
    doc = example_doc()
    model(doc)["version"] = 2
    drop_graphs(doc, {"GRAPH_OPERATION_SPECULATIVE", "GRAPH_OPERATION_TUNING", "GRAPH_OPERATION_VISION"})
    for entry in model(doc)["graphs"]:
        entry.pop("tuned_bindings", None)
    del doc["contract"]["speculative_widths"]
    del doc["manifest"]["completion"]["confidence_buffer"]
    return doc


def version_1_doc() -> dict:
    """The example reduced to contract version 1: text only, input range = sampled range."""
    doc = version_2_doc()
    mdl = model(doc)
    mdl["version"] = 1
    del mdl["input_vocabulary"], mdl["vision"]
    frontend = mdl["frontend"]
    frontend.update(image_preparation="IMAGE_PREPARATION_NONE", image_layout="IMAGE_LAYOUT_NONE")
    del frontend["image_preparation_data"], frontend["image_layout_data"]
    image_sources = {"VALUE_SOURCE_" + s for s in ("IMAGE_FEATURE_INDICES", "IMAGE_CONTEXT_INDICES",
                                                    "IMAGE_FEATURE_SLOT", "IMAGE_TENSOR")}
    for entry in mdl["graphs"]:
        entry["bindings"] = [b for b in entry["bindings"] if b["source"] not in image_sources]
        for variant in entry["variants"]:
            variant.pop("patch_capacity", None)
    for handle in doc["manifest"]["graph_handles"]:
        handle["capacity"].pop("patch_capacity", None)
    return doc
