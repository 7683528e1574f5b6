"""Recipe for Helium checkpoints (Kyutai's Helium 1): HeliumForCausalLM (transformers' HeliumConfig).

The decoder is Llama's (grouped-query attention, gated SiLU MLP, RMS norms; q/k/v biases with
``attention_bias``, MLP biases with ``mlp_bias``, never an o bias) with one difference: the rotary
embedding turns interleaved pairs (dims 2i and 2i + 1 by frequency i) of each whole head. Each q and k
head's rows (and biases) are reordered here, the pairs de-interleaved into halves
(`helios.ignition.recipes.glm4.rotary_layout`), so that the programs' rotation in halves does the same;
one permutation of both q and k leaves every q.k unchanged. HeliumRMSNorm multiplies in float32 before
rounding to the activations' dtype: a float32 core equals it, a bfloat16 one may differ in the last bit.

HeliumConfig's defaults fill the keys a config.json leaves out (``rms_norm_eps`` 1e-8, ``head_dim``
128, 20 key/value heads, rope theta 100000). The reference masks causally over the whole context. Refused by name:
another ``hidden_act``, rope types other than Llama's (default, linear, llama3, yarn), a partial
rotary factor, heads that do not span hidden_size (the reference's o_proj is hidden_size square).
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.recipes import glm4, llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("HeliumForCausalLM",)
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "max_window_layers")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {key: value for key, value in config.items() if key not in _UNREAD}
    arch = llama.architecture_from_config(source, config, tensors, dtype)
    if arch.q_size != arch.hidden_size:  # HeliumAttention's o_proj takes hidden_size inputs
        raise UnsupportedCheckpoint(f"config.json: num_attention_heads {arch.num_heads} x head_dim {arch.head_dim} is "
                                    f"not hidden_size {arch.hidden_size}, which the Helium reference's o_proj needs")
    transform = glm4.rotary_rows(glm4.rotary_layout(arch.head_dim, arch.head_dim))
    weights, used = llama.prepared_weights(arch, config, tensors, transform=transform)
    return llama.placed_recipe(source, arch, weights, used, tensors)
