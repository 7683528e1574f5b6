"""The image feeder of a loaded model whose core has VISION programs: each program encodes the images
of its patch capacity into the model's feature cache (`helios.runtime.execution.images.ImageFeeder`).
"""

from __future__ import annotations

from helios.errors import LoadError
from helios.runtime.execution.images import ImageFeeder
from helios.runtime.execution.packer import Packer
from helios.runtime.loading.model import LoadedModel, program_arguments


def image_feeder(model: LoadedModel, packer: Packer,
                 encode=lambda program, arguments: program.module(*arguments)) -> ImageFeeder | None:
    """The feeder of a core with VISION programs: they encode images into the feature cache the
    model allocated at load (`LoadedModel.image_cache`). `encode(program, arguments)` calls one
    (eagerly, or by replaying its captured graph)."""
    if not model.vision_programs:
        return None
    programs = {p.packed_token_capacity: p for p in model.vision_programs}
    arguments = {capacity: program_arguments(p, model.weights, model.buffers) for capacity, p in programs.items()}

    def encoder(capacity: int):
        program = programs.get(capacity)
        if program is None:
            return None
        return lambda: _first(encode(program, arguments[capacity]))

    if model.image_cache is None:
        raise LoadError("a model with VISION programs was loaded without an image feature cache")
    return ImageFeeder(model.prepared, model.buffers, encoder, model.image_cache)


def _first(returned):
    return returned[0] if isinstance(returned, (tuple, list)) else returned
