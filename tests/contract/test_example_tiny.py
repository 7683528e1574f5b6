"""examples/contract-tiny.json is the example contract (examples/contract.json) at small sizes: the
same graphs, bindings, value sources, state views, regions, host tables, buffers and frontend, in the
same order; only sizes, capacities, token ids and identities differ. Compared field by field, so a
change to either file that the other does not follow fails here."""

from __future__ import annotations

import json

from contract.documents import REPO, example_doc
from helios.contract import PreparedContract

TINY = REPO / "examples" / "contract-tiny.json"

# Fields whose values are sizes, capacities, token ids or identities: they may differ (same type).
SIZED = frozenset({
    "served_id", "aliases", "cache_identity", "context_tokens", "prefill_tokens", "page_capacity",
    "snapshot_capacity", "max_concurrency", "max_output_tokens", "eos_token_ids", "token_id", "end",
    "histogram_bins", "mask_words", "image_sentinel_ids", "feature_slots", "features_per_window",
    "patch_capacities", "page_tokens", "batch_capacity", "token_capacity", "packed_token_capacity",
    "patch_capacity", "constant", "open_token_id", "close_token_id", "patch_size", "min_pixels", "max_pixels",
    "feature_ids", "token_ids", "row_stride", "byte_extent", "size", "resource_id",
})


def structural_differences(big, tiny, path: str = "", sized: bool = False) -> list[str]:
    """Paths where `tiny` differs from `big` other than in a SIZED field's values."""
    if isinstance(big, dict) and isinstance(tiny, dict):
        if big.keys() != tiny.keys():
            return [f"{path}: fields {sorted(big.keys() ^ tiny.keys())}"]
        return [d for key in big for d in structural_differences(big[key], tiny[key], f"{path}.{key}".lstrip("."),
                                                                 key in SIZED)]
    if isinstance(big, list) and isinstance(tiny, list):
        if len(big) != len(tiny):
            return [f"{path}: {len(big)} entries, {len(tiny)} in the tiny contract"]
        return [d for i, (a, b) in enumerate(zip(big, tiny)) for d in structural_differences(a, b, f"{path}[{i}]",
                                                                                              sized)]
    if type(big) is not type(tiny):
        return [f"{path}: {type(big).__name__} vs {type(tiny).__name__}"]
    if big != tiny and not sized:
        return [f"{path}: {big!r} vs {tiny!r}"]
    return []


def test_tiny_contract_is_valid_and_canonical():
    text = TINY.read_text()
    assert PreparedContract.from_json(text).to_json() == text


def test_tiny_contract_has_the_example_structure():
    assert structural_differences(example_doc(), json.loads(TINY.read_text())) == []


def test_a_structural_change_is_found():
    tiny = json.loads(TINY.read_text())
    tiny["contract"]["model"]["graphs"][1]["bindings"][0]["source"] = "VALUE_SOURCE_GENERATION"
    del tiny["manifest"]["buffers"][-1]
    tiny["contract"]["model"]["host_tables"][0]["ngram_tokens"] = 2
    found = structural_differences(example_doc(), tiny)
    assert found == ["contract.model.graphs[1].bindings[0].source: 'VALUE_SOURCE_SLOT' vs 'VALUE_SOURCE_GENERATION'",
                     "contract.model.host_tables[0].ngram_tokens: 3 vs 2",
                     f"manifest.buffers: {len(example_doc()['manifest']['buffers'])} entries, "
                     f"{len(tiny['manifest']['buffers'])} in the tiny contract"]
