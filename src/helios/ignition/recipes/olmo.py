"""Recipe for OLMo 2 and OLMo 3 checkpoints: Olmo2ForCausalLM and Olmo3ForCausalLM (transformers'
Olmo2Config / Olmo3Config).

The decoder is Llama's grouped-query attention and gated SiLU MLP with these differences, each an
`Architecture` switch:

- no norm before the attention or the MLP (``pre_norms`` False): each block reads the residual
  stream as it is, and ``post_attention_layernorm`` / ``post_feedforward_layernorm`` norm the block
  outputs before their residual adds (``sandwich_norms``: ``layers.i.attn_out_norm``,
  ``layers.i.mlp_out_norm``); ``model.norm`` is the final norm;
- q/k RMS norms over the whole q and k projections (``qk_norm_whole``: weights [Hq D] and
  [Hkv D]), before the heads are split and rotated. Under tensor parallelism each rank holds its
  heads' entries and the mean square is summed over the ranks (one all-reduce per norm);
- ``attention_bias`` puts a bias on q, k, v and o (taken from what the checkpoint holds).

OLMo 3 adds sliding layers by ``layer_types`` (default: every fourth layer full, the others
sliding) over ``sliding_window`` (the reference's convention: a sliding query sees its last
``sliding_window`` positions, its own included), and one rope table per layer kind: the full
layers rotate with ``rope_parameters["full_attention"]`` (a legacy ``rope_scaling`` and
``rope_theta`` apply there), the sliding layers with ``rope_parameters["sliding_attention"]``
(``local_rope_layers``, the ``rope.local_inv_freq`` slot). As Olmo3Config resolves a legacy
config.json, a top-level ``rope_theta`` reaches the full layers only: the sliding layers keep the
class default 500000 unless their own table sets one.

Both references compute RMSNorm as ``(w * x_normed).to(dtype)`` and rotate in float32 whatever the
dtype; a float32 core equals them, a bfloat16 one rounds before the weight's product (as Llama's
norm does) and rotates in bfloat16, so it may differ in the last bit. The config classes' defaults
fill the keys a config.json leaves out (``rms_norm_eps`` 1e-5, OLMo 3's rope theta 500000 and window
4096). Refused by name: another ``hidden_act``, rope types other than Llama's (default, linear,
llama3, yarn), a sliding layers' rope with an attention factor (YaRN there: the local table is
unscaled), malformed ``layer_types``, sliding layers without a positive ``sliding_window``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
LAYER_TYPES = llama.LAYER_TYPES
OLMO3_THETA = 500_000.0  # Olmo3Config.default_theta
# The config classes' defaults (transformers 5) for the keys a config.json may leave out.
REFERENCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "Olmo2ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "rope_theta": 10_000.0},
    "Olmo3ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "sliding_window": 4096},
}
_UNREAD = ("sliding_window", "use_sliding_window", "layer_types", "rope_parameters", "rope_scaling")


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**REFERENCE_DEFAULTS[source], **config}
    is_olmo3 = source == "Olmo3ForCausalLM"
    full, sliding = rope_settings(config) if is_olmo3 else (llama.rope_parameters(config), None)
    context = {"max_position_embeddings": config.get("max_position_embeddings")}
    # Llama's reading of the geometry; the windows, layer kinds and rope tables are read here.
    plain = {key: value for key, value in config.items() if key not in _UNREAD}
    base = llama.architecture_from_config(source, {**plain, "rope_parameters": full}, tensors, dtype)
    kinds = layer_types(config, base.num_layers) if is_olmo3 else ("full_attention",) * base.num_layers
    local = tuple(layer for layer, kind in enumerate(kinds) if kind == "sliding_attention")
    arch = dataclasses.replace(
        base, layer_windows=llama.sliding_layer_windows(config, kinds),
        sandwich_norms=True, pre_norms=False, qk_norm=True, qk_norm_whole=True, local_rope_layers=local)
    inv_freq = llama.rope_inv_freq({**context, "rope_parameters": full}, arch.head_dim)
    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq)
    if local:
        local_freq = llama.rope_inv_freq({**context, "rope_parameters": sliding}, arch.head_dim)
        weights += (NamedWeight("rope.local_inv_freq", local_freq),)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as Olmo3Config resolves it: ``layer_types``, else every fourth
    layer full and the others sliding."""
    kinds = config.get("layer_types")
    if kinds is None:
        return tuple("full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(num_layers))
    return llama.listed_layer_types(kinds, num_layers)


def rope_settings(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """OLMo 3's rope settings of the full layers, then of the sliding layers (checked as Llama's:
    `helios.ignition.recipes.llama.rope_parameters`), as Olmo3Config resolves them."""
    # (Olmo3Config hands a top-level rope_theta to the full layers only)
    full, sliding = llama.layer_kind_rope(config, config.get("rope_theta", OLMO3_THETA), OLMO3_THETA)
    context = {"max_position_embeddings": config.get("max_position_embeddings")}
    tables = {}
    for kind, table in (("full_attention", full), ("sliding_attention", sliding)):
        try:
            tables[kind] = llama.rope_parameters({**context, "rope_parameters": table})
        except UnsupportedCheckpoint as error:  # named with the table it came from
            raise UnsupportedCheckpoint(f"config.json: rope_parameters[{kind!r}]: {error}") from None
    if llama.rope_attention_factor({**context, "rope_parameters": tables["sliding_attention"]}) != 1.0:
        raise UnsupportedCheckpoint(f"config.json: rope_parameters['sliding_attention']: rope_type "
                                    f"{sliding['rope_type']!r} scales the rotary tables (an attention factor), "
                                    f"which the sliding layers' table does not")
    return tables["full_attention"], tables["sliding_attention"]


def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A post-norm layer's slots (OLMo 2's names, EXAONE 4's too): its attention slots
    (`post_norm_attention_weights`), the gated MLP and its output norm."""
    out = post_norm_attention_weights(arch, layer, take) + llama.dense_mlp_weights(arch, layer, take)
    return out + [NamedWeight(f"layers.{layer}.mlp_out_norm",
                              take(f"model.layers.{layer}.post_feedforward_layernorm.weight"))]


def post_norm_attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A post-norm layer's attention slots (OLMo 2's names): q/k/v, the q/k norms, o, the output norm."""
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    attn = src + "self_attn."
    qkv = [attn + "q_proj.", attn + "k_proj.", attn + "v_proj."]
    out = [NamedWeight(dst + "qkv.weight", fused(take, [p + "weight" for p in qkv]))]
    if arch.qkv_bias:
        out.append(NamedWeight(dst + "qkv.bias", fused(take, [p + "bias" for p in qkv])))
    out += [NamedWeight(dst + "q_norm", take(attn + "q_norm.weight")),
            NamedWeight(dst + "k_norm", take(attn + "k_norm.weight")),
            NamedWeight(dst + "o.weight", take(attn + "o_proj.weight"))]
    if arch.o_bias:
        out.append(NamedWeight(dst + "o.bias", take(attn + "o_proj.bias")))
    return out + [NamedWeight(dst + "attn_out_norm", take(src + "post_attention_layernorm.weight"))]
