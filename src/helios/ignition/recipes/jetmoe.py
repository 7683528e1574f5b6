"""Recipe for JetMoE checkpoints (JetMoeForCausalLM, transformers' JetMoeConfig).

JetMoE routes twice per layer, both times by the top ``num_experts_per_tok`` of ``num_local_experts``
router logits weighted by their softmax (``router.layer.weight``):

- attention (JetMoeMoA): each chosen expert projects the queries of ``num_key_value_heads`` heads of
  ``kv_channels`` (``experts.input_linear`` [E, Hkv D, H]) that attend over the shared keys and values
  (``kv_proj``: keys, then values), and projects its heads back (``experts.output_linear`` [E, H, Hkv D]);
  the outputs are weighted by the routing weights and summed, plus ``experts.bias``. Prepared densely:
  every expert's heads attend (query head j * E + e is expert e's head j, on key/value head j: grouped-query
  attention over E * Hkv heads), and each token scales expert e's heads by its routing weight, 0 where e
  was not chosen (`Architecture.attention_experts`): the same sum, at E / top-k times the query heads'
  attention work;
- the MLP (JetMoeMoE): gated experts (``input_linear`` [E, 2F, H], gate rows then up rows;
  ``output_linear`` [E, H, F]) with ``topk_softmax`` routing, plus ``mlp.bias``: added as every expert's
  down-projection bias (the routing weights sum to 1, so their weighted sum is the bias).

The layers' two norms have epsilon 1e-6 whatever config.json says (JetMoeDecoderLayer builds them with the
default); only the final norm reads ``rms_norm_eps``, so another value is refused by name. Also refused by
name: an ``activation_function`` other than silu, a partial rotary factor, rope types other than Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("JetMoeForCausalLM",)
# JetMoeConfig's defaults for the keys this recipe reads.
_DEFAULTS = {"num_key_value_heads": 16, "kv_channels": 128, "intermediate_size": 5632, "activation_function": "silu",
             "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
_LAYER_EPS = 1e-6  # JetMoeRMSNorm's default, which the layers' norms keep


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    config = {**_DEFAULTS, **config}
    if config["activation_function"] != "silu":
        raise UnsupportedCheckpoint(f"activation_function {config['activation_function']!r} is not supported "
                                    f"(only 'silu')")
    if config["rms_norm_eps"] != _LAYER_EPS:
        raise UnsupportedCheckpoint(f"config.json: rms_norm_eps {config['rms_norm_eps']!r} (only the final norm reads "
                                    f"it; the layers' norms keep {_LAYER_EPS}, and one epsilon serves all here)")
    for key in ("num_key_value_heads", "kv_channels", "intermediate_size", "num_local_experts", "num_experts_per_tok"):
        if isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 1:
            raise UnsupportedCheckpoint(f"config.json: {key} {config[key]!r} must be a positive integer")
    experts, top_k, kv_heads = config["num_local_experts"], config["num_experts_per_tok"], config["num_key_value_heads"]
    plain = {"vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"], "intermediate_size": 0,
             "num_hidden_layers": config["num_hidden_layers"], "num_attention_heads": experts * kv_heads,
             "num_key_value_heads": kv_heads, "head_dim": config["kv_channels"], "rms_norm_eps": _LAYER_EPS,
             "tie_word_embeddings": config["tie_word_embeddings"], "dtype": config.get("dtype"),
             "torch_dtype": config.get("torch_dtype"), "rope_parameters": config.get("rope_parameters"),
             "rope_scaling": config.get("rope_scaling"), "rope_theta": config.get("rope_theta", 10000.0)}
    base = llama.architecture_from_config(source, plain, tensors, dtype)
    mlp = MixtureOfExperts(experts, top_k, config["intermediate_size"], tuple(range(base.num_layers)),
                           scoring="topk_softmax", expert_bias=True)
    arch = dataclasses.replace(base, moe=mlp, o_bias=True, attention_experts=experts, attention_experts_per_token=top_k)
    llama.rope_parameters(plain)  # refuses a partial_rotary_factor: the reference rotates whole heads

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        src, dst = f"model.layers.{layer}.", f"layers.{layer}."
        moa, moe = src + "self_attention.experts.", src + "mlp."
        head_dim, hidden = arch.head_dim, arch.hidden_size
        queries = take(moa + "input_linear.weight").reshape(experts, kv_heads, head_dim, hidden)
        outputs = take(moa + "output_linear.weight").reshape(experts, hidden, kv_heads, head_dim)
        down = take(moe + "output_linear.weight")
        return [
            NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
            NamedWeight(dst + "qkv.weight", torch.cat([queries.transpose(0, 1).reshape(-1, hidden),
                                                       take(src + "self_attention.kv_proj.weight")])),
            NamedWeight(dst + "o.weight", outputs.permute(1, 2, 0, 3).reshape(hidden, -1).contiguous()),
            NamedWeight(dst + "o.bias", take(moa + "bias")),
            NamedWeight(dst + "attn_router.weight", take(moa + "router.layer.weight").float()),
            NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")),
            NamedWeight(dst + "router.weight", take(moe + "router.layer.weight").float()),
            NamedWeight(dst + "experts.gate_up", take(moe + "input_linear.weight").contiguous()),
            NamedWeight(dst + "experts.gate_up_bias", down.new_zeros(experts, 2 * config["intermediate_size"])),
            NamedWeight(dst + "experts.down", down.contiguous()),
            NamedWeight(dst + "experts.down_bias", take(moe + "bias").expand(experts, -1).contiguous()),
        ]

    weights, used = llama.prepared_weights(arch, plain, tensors, layer_weights)
    return llama.placed_recipe(source, arch, weights, used, tensors)
