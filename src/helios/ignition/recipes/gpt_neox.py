"""Recipe for GPT-NeoX checkpoints (GPT-NeoX-20B, Pythia, ...): GPTNeoXForCausalLM (transformers'
GPTNeoXConfig).

The decoder differs from Llama's in its names, projections, norms and block, each an `Architecture`
switch or a weight rearrangement:

- multi-head attention whose fused ``attention.query_key_value`` holds, per head, its q, k and v rows
  (``[heads, 3, head_dim]``): split into Helios' q / k / v rows; biases on it and on ``attention.dense``
  (the o projection) with ``attention_bias``; heads ``hidden_size / num_attention_heads`` wide;
- every norm is ``nn.LayerNorm`` with a bias (``layer_norm``, ``norm_bias``); epsilon ``layer_norm_eps``;
- ``use_parallel_residual`` (the default): x + attention(input_layernorm(x)) + mlp(post_attention_layernorm(x))
  (``parallel_block`` with ``parallel_mlp_norm``: each block reads its own norm of the layer's input);
  otherwise the sequential block;
- a non-gated MLP with biases (``dense_h_to_4h`` -> activation -> ``dense_4h_to_h``): ``hidden_act``
  "gelu" (exact, the default), "gelu_new" / "gelu_fast" / "gelu_pytorch_tanh" (the tanh approximation:
  one formula, rounded apart in the last bits), "relu2", "silu";
- partial rotary over the leading ``head_dim * rotary_pct`` dimensions of each head (0.25 by default)
  in halves, as Phi's (`helios.ignition.recipes.moe.rotary_order`).

As GPTNeoXConfig reads them, the rope's theta and partial factor are the rope dict's own, else the
legacy ``rotary_emb_base`` / ``rotary_pct`` (a top-level ``rope_theta`` or ``partial_rotary_factor`` is
not read); its defaults fill the keys a config.json leaves out (``layer_norm_eps`` 1e-5, gelu, the
parallel residual). ``embed_out`` (older checkpoints) or ``lm_head`` is the head; the causal-mask
buffers older checkpoints hold (``attention.bias``, ``attention.masked_bias``) are not weights. Refused
by name: another ``hidden_act``, rope types other than Llama's, a partial rotary factor that leaves no
even rotated width, a ``head_dim`` that would resize the reference's rotary table, a ``hidden_size``
that the heads do not divide.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import rotary_order
from helios.ignition.recipes.stablelm import rotary_table_width

ARCHITECTURES = ("GPTNeoXForCausalLM",)
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu2": "relu2", "silu": "silu"}
_MASK_BUFFERS = (".attention.bias", ".attention.masked_bias", ".attention.rotary_emb.inv_freq")
_ROOT = "gpt_neox."


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    rope = rope_config(config)
    arch = architecture(source, config, rope, tensors, dtype)
    rotary = rotary_table_width(rope, arch.head_dim)
    inv_freq = torch.zeros(arch.head_dim // 2, dtype=torch.float32)
    inv_freq[: rotary // 2] = llama.rope_inv_freq(rope, rotary, partial=True)
    order = rotary_order(arch.head_dim, rotary)
    used: set[str] = {name for name in tensors.names if name.endswith(_MASK_BUFFERS)}

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    weights = [NamedWeight("embed", take(_ROOT + "embed_in.weight"))]
    for layer in range(arch.num_layers):
        weights += _layer_weights(arch, layer, take, order)
    weights += [NamedWeight("final_norm", take(_ROOT + "final_layer_norm.weight")),
                NamedWeight("final_norm_bias", take(_ROOT + "final_layer_norm.bias"))]
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("embed_out.weight" if "embed_out.weight" in tensors
                                                   else "lm_head.weight")))
    weights.append(NamedWeight("rope.inv_freq", inv_freq))
    return llama.placed_recipe(source, arch, tuple(weights), used, tensors)


def rope_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rope settings as GPTNeoXConfig resolves them, in the layout `llama.rope_parameters` reads:
    ``rope_scaling`` or ``rope_parameters`` whose missing theta and partial factor come from
    ``rotary_emb_base`` (10000) and ``rotary_pct`` (0.25)."""
    params = llama.rope_settings(config)
    params.setdefault("rope_theta", config.get("rotary_emb_base", 10_000.0))
    params.setdefault("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return {"rope_parameters": params, "max_position_embeddings": config.get("max_position_embeddings"),
            **({"head_dim": config["head_dim"]} if "head_dim" in config else {})}


def architecture(source: str, config: Mapping[str, Any], rope: Mapping[str, Any], tensors: CheckpointTensors,
                 dtype: str | None) -> Architecture:
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads:
        raise UnsupportedCheckpoint(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads "
                                    f"{heads}")
    llama.check_declared_biases(source, config, tensors, _ROOT + "layers.0.")  # qkv_bias / o_bias: the tensors'
    parallel = bool(config.get("use_parallel_residual", True))
    num_layers = int(config["num_hidden_layers"])
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers, num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        rms_norm_eps=llama.norm_epsilon(config, "layer_norm_eps"), layer_windows=(0,) * num_layers,
        qkv_bias=_ROOT + "layers.0.attention.query_key_value.bias" in tensors,
        o_bias=_ROOT + "layers.0.attention.dense.bias" in tensors, mlp_bias=True,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or llama._checkpoint_dtype(config, tensors, _ROOT + "embed_in.weight"),
        rotary_factor=llama.rope_attention_factor(rope), layer_norm=True, norm_bias=True,
        parallel_block=parallel, parallel_mlp_norm=parallel, gated_mlp=False,
        mlp_activation=llama.mlp_activation(config, _ACTIVATIONS))


def split_qkv(tensor: torch.Tensor, heads: int, order: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's fused q/k/v rows (per head: q, k, v) as Helios' (all q rows, then k, then v), each
    head's q and k dimensions in the rotary `order`."""
    per_head = tensor.reshape(heads, 3, -1, *tensor.shape[1:])
    q, k, v = per_head[:, 0][:, order], per_head[:, 1][:, order], per_head[:, 2]
    return torch.cat([part.reshape(-1, *tensor.shape[1:]) for part in (q, k, v)]).contiguous()


def _layer_weights(arch: Architecture, layer: int, take, order: torch.Tensor) -> list[NamedWeight]:
    src, dst = f"{_ROOT}layers.{layer}.", f"layers.{layer}."
    attn, mlp = src + "attention.", src + "mlp."
    out = [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
           NamedWeight(dst + "input_norm_bias", take(src + "input_layernorm.bias")),
           NamedWeight(dst + "qkv.weight", split_qkv(take(attn + "query_key_value.weight"), arch.num_heads, order))]
    if arch.qkv_bias:
        out.append(NamedWeight(dst + "qkv.bias", split_qkv(take(attn + "query_key_value.bias"), arch.num_heads, order)))
    out.append(NamedWeight(dst + "o.weight", take(attn + "dense.weight")))
    if arch.o_bias:
        out.append(NamedWeight(dst + "o.bias", take(attn + "dense.bias")))
    return out + [NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")),
                  NamedWeight(dst + "post_norm_bias", take(src + "post_attention_layernorm.bias")),
                  NamedWeight(dst + "up.weight", take(mlp + "dense_h_to_4h.weight")),
                  NamedWeight(dst + "up.bias", take(mlp + "dense_h_to_4h.bias")),
                  NamedWeight(dst + "down.weight", take(mlp + "dense_4h_to_h.weight")),
                  NamedWeight(dst + "down.bias", take(mlp + "dense_4h_to_h.bias"))]
