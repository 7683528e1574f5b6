"""The calling convention a vision-language core adds to `program_spec` (`ProgramOptions.multimodal`).

The weight list carries the recipe's extra weights after the decoder's (the mrope table
``rope.mrope_components`` and the encoder's ``vision.*``), so every program takes one weight set.

* VISION (capacity: 1 row, T = P patches): the image layout's vision tensors at patch capacity P
  (``pixel_patches`` [P, patch_width], ``rotary_positions`` [P, 2], ``window_segments`` [P],
  ``image_segments`` [P], ``feature_order`` [P / merge^2]); output ``encoded_features``
  [P / merge^2, W], the features of the patches' images in image order, padding features last;
  W = H, or (1 + k) * H with k DeepStack blocks (Qwen3-VL), added after the first k layers.
* PREFILL and MIXED also take ``rotary_offsets`` int64 [T, 3] (each packed token's rotary position
  minus its sequence position, per component; the layout's ``rotary_offsets`` output),
  ``image_feature_indices`` int64 [T] (the row of ``image_features`` that replaces the token's
  embedding, -1 for text), ``image_features`` [F, W] (written by the host from encoded features
  before the step; F = `MultimodalOptions.feature_rows`) and the persistent ``rotary_deltas`` int64
  [slots], where every row stores the offset of its last packed token (the rotary offset every later
  token of the request keeps).
* DECODE also takes ``rotary_deltas`` (read only): a generated token's rotary position is its
  sequence position plus its slot's delta, on all three components.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.ignition.architecture import Architecture, CheckpointError, WeightSlot
from helios.ignition.program_spec import (
    Access, Capacity, InputRole, Operation, OutputSpec, ProgramOptions, ProgramSpec, TensorSpec,
)
from helios.ignition.recipes.vision import VisionArchitecture

ROTARY_OFFSETS = "rotary_offsets"
FEATURE_INDICES = "image_feature_indices"
IMAGE_FEATURES = "image_features"
ROTARY_DELTAS = "rotary_deltas"
ENCODED_FEATURES = "encoded_features"
VISION_INPUTS = ("pixel_patches", "rotary_positions", "window_segments", "image_segments", "feature_order")
PROMPT_INPUTS = (ROTARY_OFFSETS, FEATURE_INDICES, IMAGE_FEATURES, ROTARY_DELTAS)
_FEATURE_OPERATIONS = (Operation.PREFILL, Operation.MIXED)


@dataclass(frozen=True)
class MultimodalOptions:
    """The encoder's geometry, the extra weights' slots and the rows of the step feature buffer."""

    vision: VisionArchitecture
    extra_weights: tuple[WeightSlot, ...]
    feature_rows: int

    @property
    def patches_per_feature(self) -> int:
        return self.vision.merge_size ** 2


def extra_weight_slots(options: ProgramOptions) -> tuple[WeightSlot, ...]:
    multimodal = options.multimodal
    return multimodal.extra_weights if multimodal is not None else ()


def vision_spec(capacity: Capacity, page_tokens: int, weights: tuple[WeightSlot, ...],
                options: ProgramOptions) -> ProgramSpec:
    multimodal = _required(options, Operation.VISION)
    patches, unit = capacity.packed_token_capacity, multimodal.patches_per_feature
    if capacity.batch_capacity != 1 or patches % unit:
        raise CheckpointError(f"a VISION variant encodes one row of a multiple of {unit} patches, got {capacity}")
    vision, features = multimodal.vision, patches // unit
    inputs = (
        TensorSpec("weights", "tensor_list", (len(weights),), InputRole.WEIGHTS),
        TensorSpec(VISION_INPUTS[0], "float32", (patches, vision.patch_width)),
        TensorSpec(VISION_INPUTS[1], "int64", (patches, 2)),
        TensorSpec(VISION_INPUTS[2], "int32", (patches,)),
        TensorSpec(VISION_INPUTS[3], "int32", (patches,)),
        TensorSpec(VISION_INPUTS[4], "int64", (features,)),
    )
    dtype = next(slot.dtype for slot in weights if slot.name == "vision.patch_embed")
    outputs = (OutputSpec(ENCODED_FEATURES, dtype, (features, vision.feature_width)),)
    return ProgramSpec(Operation.VISION, capacity, page_tokens, inputs, outputs, weights, options=options)


def step_inputs(arch: Architecture, capacity: Capacity, operation: Operation,
                options: ProgramOptions) -> tuple[TensorSpec, ...]:
    if options.multimodal is None:
        return ()
    multimodal = _required(options, operation)
    deltas = TensorSpec(ROTARY_DELTAS, "int64", ("slots",), InputRole.PERSISTENT_STATE, Access.READ_WRITE)
    if operation is Operation.DECODE:
        return (TensorSpec(ROTARY_DELTAS, "int64", ("slots",), InputRole.PERSISTENT_STATE, Access.READ),)
    tokens = capacity.packed_token_capacity
    return (
        TensorSpec(ROTARY_OFFSETS, "int64", (tokens, 3)),
        TensorSpec(FEATURE_INDICES, "int64", (tokens,)),
        TensorSpec(IMAGE_FEATURES, arch.dtype, (multimodal.feature_rows, multimodal.vision.feature_width)),
        deltas,
    )


def _required(options: ProgramOptions, operation: Operation) -> MultimodalOptions:
    if options.multimodal is None:
        raise CheckpointError(f"{operation.value} programs of images need ProgramOptions.multimodal")
    if operation not in (*_FEATURE_OPERATIONS, Operation.DECODE, Operation.VISION):
        raise CheckpointError(f"a vision-language core has no {operation.value} programs")
    if options.draft is not None:
        raise CheckpointError("a vision-language core has no draft model")
    return options.multimodal
