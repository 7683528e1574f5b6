"""The non-gated MLP (``Architecture.gated_mlp`` False) of checkpoints that name its projections
``mlp.up_proj`` / ``mlp.down_proj`` (Apertus, Arcee, Nemotron): ``down(act(up(x)))``.

`build` prepares a Llama-shaped decoder with that MLP (Apertus, Arcee): Llama's attention weights
(their norms renamed where the family names them apart), the MLP's activation from ``hidden_act``.

`mlp_weights` places a layer's ``up`` and ``down`` slots (with their biases where the checkpoint holds
them: ``Architecture.mlp_bias``) and, for an activation with learned scalars (xIELU: ``mlp.act_fn``'s
``alpha_p`` / ``alpha_n`` parameters and ``beta`` / ``eps`` buffers), the ``mlp_act`` slot.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.activations import xielu_parameters
from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

BIAS = "model.layers.0.mlp.up_proj.bias"  # present: the MLP's projections have biases
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "hidden_act")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None,
          activations: Mapping[str, str], norms: Mapping[str, str] | None = None, **switches) -> Recipe:
    """The recipe of a Llama-shaped checkpoint with the non-gated MLP: ``hidden_act`` one of
    `activations` (mapped to `Architecture.mlp_activation`), each layer tensor name containing a key of
    `norms` read under its value instead, `switches` other Architecture fields. The reference masks
    causally over the whole context (window settings are not read)."""
    activation = llama.mlp_activation(config, activations)
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, plain, tensors, dtype)
    arch = dataclasses.replace(base, gated_mlp=False, mlp_activation=activation, mlp_bias=BIAS in tensors,
                               **switches)

    def renamed(take):
        def read(name: str):
            for llama_name, own in (norms or {}).items():
                name = name.replace(llama_name, own)
            return take(name)
        return read

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return llama.attention_weights(arch, layer, renamed(take)) + mlp_weights(arch, layer, take, tensors)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def mlp_weights(arch: Architecture, layer: int, take, tensors: CheckpointTensors,
                src: str | None = None) -> list[NamedWeight]:
    """A layer's ``up`` (+ bias), ``mlp_act`` (xielu) and ``down`` (+ bias) slots, from the checkpoint's
    ``src`` up_proj / down_proj (default ``model.layers.<layer>.mlp.``; Nemotron-H's MLP blocks differ)."""
    src, dst = src or f"model.layers.{layer}.mlp.", f"layers.{layer}."
    out = [NamedWeight(dst + "up.weight", take(src + "up_proj.weight"))]
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "up.bias", take(src + "up_proj.bias")))
    if arch.mlp_activation == "xielu":
        act = src + "act_fn."
        if act + "alpha_p" not in tensors or act + "alpha_n" not in tensors:
            raise UnsupportedCheckpoint(f"hidden_act 'xielu' needs {act}alpha_p and {act}alpha_n in the checkpoint")
        buffers = [take(act + name) if act + name in tensors else None for name in ("beta", "eps")]
        params = xielu_parameters(take(act + "alpha_p"), take(act + "alpha_n"), *buffers)
        out.append(NamedWeight(dst + "mlp_act", params))
    out.append(NamedWeight(dst + "down.weight", take(src + "down_proj.weight")))
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "down.bias", take(src + "down_proj.bias")))
    return out
