"""Model-contract rules that need only the ModelContract itself: version, vocabularies, vision
and cache geometry. Cross-document rules (buffers behind regions, views) live in
validate_cross.py.
"""

from __future__ import annotations

from helios.contract import serving_pb2 as spb
from helios.contract.rules import MODEL, fail, require

SUPPORTED_VERSIONS = (1, 2, 3)
EXPORTED_VERSION = 3
# Regions whose storage page ids address (page-table views may name them). A sliding window is paged
# too: its pages that fall outside the window are released (the runtime's cache policy).
PAGED_KINDS = frozenset({spb.HISTORY_KIND_PAGED_KEY_VALUE, spb.HISTORY_KIND_PAGED_LATENT,
                         spb.HISTORY_KIND_SLIDING_WINDOW})


def input_range(model: spb.ModelContract) -> tuple[int, int]:
    """Valid input ids [begin, end): version 1 contracts accept exactly the sampled range."""
    if model.HasField("input_vocabulary"):
        rng = model.input_vocabulary.input
    else:
        rng = model.vocabulary.sampled
    return rng.begin, rng.end


def check_model(model: spb.ModelContract) -> None:
    require(
        model.version in SUPPORTED_VERSIONS,
        f"{MODEL}.version",
        f"unsupported contract version {model.version} (supported: 1, 2, 3)",
    )
    _check_vocabulary(model)
    _check_input_vocabulary(model)
    _check_vision(model)
    _check_cache(model)
    for i, view in enumerate(model.state_views):
        require(view.byte_extent > 0, f"{MODEL}.state_views[{i}].byte_extent", "state view is empty")
    require(len(model.graphs) > 0, f"{MODEL}.graphs", "the contract declares no graphs")
    require(model.HasField("frontend"), f"{MODEL}.frontend", "frontend contract is required")


def _check_range(rng: spb.TokenRange, path: str) -> None:
    require(rng.begin < rng.end, f"{path}.end", f"empty token range [{rng.begin}, {rng.end})")


def _check_vocabulary(model: spb.ModelContract) -> None:
    path = f"{MODEL}.vocabulary"
    require(model.HasField("vocabulary"), path, "vocabulary is required")
    vocab = model.vocabulary
    require(vocab.HasField("sampled"), f"{path}.sampled", "sampled token range is required")
    _check_range(vocab.sampled, f"{path}.sampled")
    end = vocab.sampled.end
    require(vocab.histogram_bins >= end, f"{path}.histogram_bins", f"fewer bins than sampled ids ({end})")
    require(vocab.mask_words * 32 >= end, f"{path}.mask_words", f"mask rows cannot cover {end} sampled ids")
    seen: set[int] = set()
    for i, token in enumerate(vocab.excluded_ids):
        item = f"{path}.excluded_ids[{i}]"
        require(vocab.sampled.begin <= token < end, item, f"excluded id {token} is outside the sampled range")
        require(token not in seen, item, f"duplicate excluded id {token}")
        seen.add(token)
    require(len(seen) < end - vocab.sampled.begin, f"{path}.excluded_ids", "every sampled id is excluded")


def _check_input_vocabulary(model: spb.ModelContract) -> None:
    path = f"{MODEL}.input_vocabulary"
    if model.version < 2:
        require(not model.HasField("input_vocabulary"), path, "input_vocabulary requires contract version >= 2")
        return
    require(model.HasField("input_vocabulary"), path, f"required by contract version {model.version}")
    inputs = model.input_vocabulary
    require(inputs.HasField("input"), f"{path}.input", "input token range is required")
    _check_range(inputs.input, f"{path}.input")
    sampled = model.vocabulary.sampled
    require(
        inputs.input.begin <= sampled.begin and sampled.end <= inputs.input.end,
        f"{MODEL}.vocabulary.sampled",
        f"sampled range [{sampled.begin}, {sampled.end}) lies outside the input range "
        f"[{inputs.input.begin}, {inputs.input.end})",
    )
    seen: set[int] = set()
    for i, token in enumerate(inputs.image_sentinel_ids):
        item = f"{path}.image_sentinel_ids[{i}]"
        require(inputs.input.begin <= token < inputs.input.end, item, f"sentinel {token} is outside the input range")
        require(
            not (sampled.begin <= token < sampled.end) or token in model.vocabulary.excluded_ids,
            item,
            f"sentinel {token} is a sampled id; declare it in vocabulary.excluded_ids so sampling never returns it",
        )
        require(token not in seen, item, f"duplicate image sentinel {token}")
        seen.add(token)


def _check_vision(model: spb.ModelContract) -> None:
    path = f"{MODEL}.vision"
    if not model.HasField("vision"):
        return
    require(model.version >= 2, path, "vision requires contract version >= 2")
    vision = model.vision
    require(vision.feature_slots > 0, f"{path}.feature_slots", "must be nonzero")
    require(vision.features_per_window > 0, f"{path}.features_per_window", "must be nonzero")
    require(
        vision.features_per_window <= vision.feature_slots,
        f"{path}.features_per_window",
        f"exceeds feature_slots ({vision.feature_slots})",
    )
    ratio = vision.patches_per_feature
    require(ratio > 0, f"{path}.patches_per_feature", "must be nonzero")
    require(len(vision.patch_capacities) > 0, f"{path}.patch_capacities", "no captured patch capacity")
    previous = 0
    for i, patches in enumerate(vision.patch_capacities):
        item = f"{path}.patch_capacities[{i}]"
        require(patches > previous, item, "patch capacities must be nonzero and strictly ascending")
        require(patches % ratio == 0, item, f"{patches} is not a multiple of patches_per_feature ({ratio})")
        require(
            patches // ratio <= vision.feature_slots,
            item,
            f"{patches // ratio} features exceed feature_slots ({vision.feature_slots})",
        )
        previous = patches


def _check_cache(model: spb.ModelContract) -> None:
    path = f"{MODEL}.cache"
    require(model.HasField("cache"), path, "cache contract is required")
    cache = model.cache
    require(cache.page_tokens > 0, f"{path}.page_tokens", "page_tokens must be nonzero")
    for i, region in enumerate(cache.regions):
        _check_region(region, cache.page_tokens, f"{path}.regions[{i}]")


def _check_region(region: spb.HistoryRegion, page_tokens: int, path: str) -> None:
    require(len(region.planes) > 0, f"{path}.planes", "a history region names at least one plane")
    if region.kind == spb.HISTORY_KIND_SLIDING_WINDOW:
        require(region.window_tokens > 0, f"{path}.window_tokens", "sliding windows declare their token extent")
    else:
        require(region.window_tokens == 0, f"{path}.window_tokens", "only sliding windows declare a window")
    if region.kind in PAGED_KINDS:
        ratio = region.tokens_per_record
        require(ratio > 0, f"{path}.tokens_per_record", "paged regions declare tokens per record")
        require(page_tokens % ratio == 0, f"{path}.tokens_per_record", f"does not divide page_tokens ({page_tokens})")
    else:
        require(region.tokens_per_record == 0, f"{path}.tokens_per_record", "only paged regions are paged by records")
    seen: set[str] = set()
    for j, plane in enumerate(region.planes):
        require(plane != "", f"{path}.planes[{j}]", "plane name is empty")
        if plane in seen:
            fail(f"{path}.planes[{j}]", f"duplicate plane {plane!r}")
        seen.add(plane)
