"""Recipe for Apertus checkpoints: ApertusForCausalLM (transformers' ApertusConfig).

The decoder is Llama's grouped-query attention (q/k/v/o biases where ``attention_bias`` puts them)
with Qwen3's per-head q/k RMS norms before the rotation (``qk_norm``) and a non-gated MLP
(``gated_mlp`` False: ``up_proj`` -> activation -> ``down_proj``, `helios.ignition.recipes.plain_mlp`).
Its activation is xIELU (``hidden_act`` "xielu", the default): two learned scalars per layer and two
buffers, placed as the ``layers.i.mlp_act`` slot (`helios.ignition.activations`); ApertusMLP takes
``relu2``, ``silu``, ``gelu`` and ``gelu_pytorch_tanh`` too. The layers' norms are named
``attention_layernorm`` (before the attention: ``input_norm``) and ``feedforward_layernorm`` (before
the MLP: ``post_norm``).

ApertusConfig's defaults fill the keys a config.json leaves out (``rms_norm_eps`` 1e-5, xielu, and
without rope settings the llama3 rope of theta 1.2e7, factor 8 over an original context of 8192,
which a top-level ``rope_theta`` alone does not change). The reference masks causally over the whole
context. Refused by name: another ``hidden_act``, rope types other than Llama's (default, linear,
llama3, yarn), a partial rotary factor, a null ``head_dim``.
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.recipes import plain_mlp
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("ApertusForCausalLM",)
_ACTIVATIONS = {"xielu": "xielu", "relu2": "relu2", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
_NORMS = {"input_layernorm": "attention_layernorm", "post_attention_layernorm": "feedforward_layernorm"}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    if "head_dim" in config and config["head_dim"] is None:  # ApertusAttention sizes heads by it when present
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Apertus reference cannot size heads by")
    return plain_mlp.build(source, config, tensors, dtype, _ACTIVATIONS, _NORMS, qk_norm=True)
