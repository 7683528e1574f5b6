"""Recipe for Arcee checkpoints (AFM): ArceeForCausalLM (transformers' ArceeConfig).

The decoder is Llama's (attention, norms, rope settings: default, linear, llama3, yarn; biases where
``attention_bias`` / ``mlp_bias`` put them) with a non-gated MLP (``gated_mlp`` False: ``up_proj`` ->
activation -> ``down_proj``, `helios.ignition.recipes.plain_mlp`) whose activation is relu^2
(``hidden_act`` "relu2", the default; ``silu``, ``gelu`` and ``gelu_pytorch_tanh`` are taken too).
ArceeConfig's defaults fill the keys a config.json leaves out (``rms_norm_eps`` 1e-5, relu2). The
reference masks causally over the whole context. Refused by name: another ``hidden_act``, another rope
type, a partial rotary factor (a null ``head_dim`` is ArceeConfig's: hidden_size / heads).
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.recipes import plain_mlp
from helios.ignition.recipes.base import Recipe
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("ArceeForCausalLM",)
_ACTIVATIONS = {"relu2": "relu2", "silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    return plain_mlp.build(source, config, tensors, dtype, _ACTIVATIONS)
