"""What a recipe produces: an Architecture and its weights in program order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from helios.ignition.architecture import Architecture, CheckpointError, weight_layout
from helios.ignition.recipes.checkpoint import is_finite


_ROPE_SLOTS = ("rope.inv_freq", "rope.local_inv_freq")


class NamedWeight(NamedTuple):
    name: str
    tensor: torch.Tensor


@dataclass(frozen=True)
class Recipe:
    """A prepared model: `weights` follow `weight_layout(architecture)` exactly (names, shapes, dtypes).

    `source_architecture` is the checkpoint's declared class (for messages and provenance only; no
    program or runtime behaviour depends on it).

    `extra_weights` follow the decoder's weights in the program weight list: tables and encoders a
    multimodal recipe's programs read (for one rank; tensor parallelism does not cut them).
    `vision` is the recipe's vision-language description (`qwen_vl.VisionLanguageRecipe`), or None.
    `notices` are lines for whoever prepares the core: a choice the recipe made that the prepared
    model shows (Phi-3's LongRoPE factor list beyond the original context), not an error.
    `inputs_embeds_scale` is the factor the reference applies to its input embeddings after they are
    formed (Granite's embedding_multiplier, which the programs apply to the lookup as
    ``Architecture.embedding_scale``): rows added to the looked-up embeddings (an Engram table's
    projection) are scaled by it too. 1.0 where the scale is part of the lookup (Gemma) or there is none.
    """

    source_architecture: str
    architecture: Architecture
    weights: tuple[NamedWeight, ...]
    extra_weights: tuple[NamedWeight, ...] = ()
    vision: Any = None
    notices: tuple[str, ...] = ()
    inputs_embeds_scale: float = 1.0

    def __post_init__(self) -> None:
        check_weights(self.architecture, self.weights)

    @property
    def weight_tensors(self) -> list[torch.Tensor]:
        """The first program input."""
        return [weight.tensor for weight in self.weights]


def fused(take, names: list[str], *, stack: bool = False) -> torch.Tensor:
    """`torch.cat` (rows) or, with `stack`, `torch.stack` of the checkpoint tensors `names` read
    through `take`; tensors whose shapes do not fit together raise CheckpointError naming them."""
    tensors = [take(name) for name in names]
    shapes = [tuple(tensor.shape) for tensor in tensors]
    fits = len(set(shapes)) == 1 if stack else all(shapes) and len({shape[1:] for shape in shapes}) == 1
    if not fits:
        listed = ", ".join(f"{name} {list(shape)}" for name, shape in zip(names, shapes))
        raise CheckpointError(f"tensors {listed} do not {'stack' if stack else 'join row-wise'}")
    return torch.stack(tensors) if stack else torch.cat(tensors)


def shaped(tensor: torch.Tensor, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """`tensor`, the checkpoint's `name`, where it has `shape` (its reference parameter's, which a
    recipe then reshapes or splits); else a CheckpointError naming it: a reshape alone takes any
    tensor of as many elements, a transposed one included, and serves its values scrambled."""
    if tuple(tensor.shape) != tuple(shape):
        raise CheckpointError(f"tensor {name} is {list(tensor.shape)}, where the reference's parameter is "
                              f"{list(shape)}")
    return tensor


def conv_weight(tensor: torch.Tensor, name: str, channels: int, kernel: int) -> torch.Tensor:
    """A depthwise convolution's weight as [channels, kernel], from the [channels, 1, kernel] an
    nn.Conv1d holds (`shaped`)."""
    return shaped(tensor, name, (channels, 1, kernel)).reshape(channels, kernel)


class UnsupportedCheckpoint(CheckpointError):
    """A checkpoint whose architecture, activation, rope type or tensors no recipe supports."""


def check_weights(arch: Architecture, weights: tuple[NamedWeight, ...]) -> None:
    layout = weight_layout(arch)
    names = [weight.name for weight in weights]
    if names != [slot.name for slot in layout]:
        raise CheckpointError(f"weights {names} do not follow the program layout")
    for slot, weight in zip(layout, weights):
        if tuple(weight.tensor.shape) != slot.shape or str(weight.tensor.dtype) != f"torch.{slot.dtype}":
            raise CheckpointError(
                f"weight {slot.name} is {tuple(weight.tensor.shape)} {weight.tensor.dtype}, "
                f"the layout needs {slot.shape} {slot.dtype}"
            )
        # The checkpoint's values are finite (CheckpointTensors.get); float16 holds only up to 65504.
        if weight.tensor.dtype == torch.float16 and not is_finite(weight.tensor):
            raise CheckpointError(f"weight {slot.name} overflows float16 (a value beyond 65504); "
                                  f"prepare it in bfloat16 or float32")
        if slot.name in _ROPE_SLOTS and not is_finite(weight.tensor):  # computed from the rope settings
            raise CheckpointError("config.json's rope settings yield non-finite rotary frequencies")


def hybrid_layer_kinds(kinds, num_layers: int, allowed: tuple[str, ...], required: tuple[str, ...] | None = None,
                       what: str = "a hybrid of both") -> tuple[str, ...]:
    """`kinds` (``layer_types`` or a family's rule) as a tuple, one of `allowed` per layer and each of
    `required` (default: every allowed kind) among them; else an UnsupportedCheckpoint naming them."""
    kinds = tuple(kinds)
    if len(kinds) != num_layers or not set(kinds) <= set(allowed):
        raise UnsupportedCheckpoint(f"layer_types {list(kinds)} must give each of the {num_layers} layers one of "
                                    f"{allowed}")
    for kind in allowed if required is None else required:
        if kind not in kinds:
            raise UnsupportedCheckpoint(f"layer_types without a {kind!r} layer are not supported ({what})")
    return kinds
