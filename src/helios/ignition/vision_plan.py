"""What preparation adds for a vision-language recipe (`Recipe.vision`): the VISION variants at the
patch capacities, the programs' multimodal options and the contract's image declarations."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError, WeightSlot
from helios.ignition.multimodal_spec import MultimodalOptions
from helios.ignition.preparation.vision_contract import (
    ImageProcessorSettings, check_patch_geometry, declare_vision, max_image_patches, read_image_processor)
from helios.ignition.program_spec import Capacity, Operation
from helios.ignition.recipes import Recipe


MAX_PATCHES = 1 << 18  # four times the patches of Qwen2.5-VL's default largest image


@dataclass(frozen=True)
class VisionPreparation:
    multimodal: MultimodalOptions
    variants: tuple[tuple[Operation, Capacity], ...]  # the VISION programs
    declare: Callable[[spb.ModelContract], None]
    patch_capacities: tuple[int, ...]


def vision_preparation(checkpoint: Path, recipe: Recipe, text_variants: Sequence[tuple[Operation, Capacity]],
                       patch_capacities: Sequence[int] = ()) -> VisionPreparation | None:
    """None for a text-only recipe. `patch_capacities` default to the largest image's patches (the
    processor's max_pixels); each must be a positive multiple of merge^2."""
    vl = recipe.vision
    if vl is None:
        if patch_capacities:
            raise CheckpointError(f"patch capacities apply to vision-language checkpoints; "
                                  f"{recipe.source_architecture} is text-only")
        return None
    unsupported = sorted({op.value for op, _ in text_variants} - {"prefill", "decode", "mixed", "tuning"})
    if unsupported:
        raise CheckpointError(f"a vision-language core has no {', '.join(unsupported)} programs")
    processor = read_image_processor(checkpoint)
    check_patch_geometry(vl.vision, processor)
    unit = vl.vision.merge_size ** 2
    capacities = tuple(sorted(set(patch_capacities))) or (max_image_patches(vl, processor),)
    if any(c <= 0 or c % unit for c in capacities):
        raise CheckpointError(f"patch capacities must be positive multiples of {unit}, got {list(capacities)}")
    smallest = min_image_patches(vl.vision, processor)
    # A capacity below it holds no image: its VISION program would be captured for nothing, and a core
    # of such capacities alone would refuse every image at serving.
    if min(capacities) < smallest:
        raise CheckpointError(f"--patch-capacities {min(capacities)} holds no image: the processor's smallest "
                              f"image (min_pixels {processor.min_pixels}) has {smallest} patches or more; give "
                              f"capacities of at least {smallest}")
    if max(capacities) > MAX_PATCHES:  # capture allocates example inputs of this extent
        raise CheckpointError(f"patch capacities are at most {MAX_PATCHES}, got {max(capacities)} (lower "
                              f"--patch-capacities or the processor's max_pixels)")
    feature_rows = max(c.packed_token_capacity for op, c in text_variants if op in (Operation.PREFILL, Operation.MIXED))
    feature_rows = max(feature_rows, max(capacities) // unit)
    extra = tuple(WeightSlot(w.name, tuple(w.tensor.shape), str(w.tensor.dtype).removeprefix("torch."))
                  for w in recipe.extra_weights)
    return VisionPreparation(
        MultimodalOptions(vl.vision, extra, feature_rows),
        tuple((Operation.VISION, Capacity(1, c)) for c in capacities),
        functools.partial(_declare, vl, processor, capacities, feature_rows), capacities)


def min_image_patches(vision, processor: ImageProcessorSettings) -> int:
    """At most the patches of the smallest image the processor produces (its resize,
    `helios.frontend.images.preparation.smart_size`, whose sides are multiples of the merge unit's
    side f = patch * merge): one not scaled down keeps at least ``min_pixels`` (rounded up to whole
    units); one scaled down to ``max_pixels`` floors each side to a multiple of f but to f at least,
    which keeps at least half of it, so a quarter of ``max_pixels`` at least."""
    unit_pixels = (vision.patch_size * vision.merge_size) ** 2
    units = min(-(-processor.min_pixels // unit_pixels), -(-processor.max_pixels // (4 * unit_pixels)))
    return max(1, units) * vision.merge_size ** 2


def _declare(vl, processor, capacities, feature_rows, model: spb.ModelContract) -> None:
    declare_vision(model, vl, processor, capacities, feature_rows)
