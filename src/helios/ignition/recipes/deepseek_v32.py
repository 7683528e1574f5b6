"""Recipe for DeepSeek-V3.2 (DeepseekV32ForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM) checkpoints:
DeepSeek-V3's latent attention and routing with DeepSeek Sparse Attention (DSA).

The decoder is GLM-4.7-Flash's reading of DeepSeek-V3 (`helios.ignition.recipes.deepseek`: the query
through the low-rank pair, the key/value latent and shared rotary key, YaRN with DeepSeek's mscale,
sigmoid routing with the correction bias in groups, the sparse layers those ``mlp_layer_types``
marks, by default all from ``first_k_dense_replace`` on); the attention's rotary rows are always
interleaved (the references have no ``rope_interleave``), so they are de-interleaved here. Each
layer adds transformers' DeepseekV32Indexer as an `Architecture.indexer`
(`helios.ignition.token_indexer`): ``index_n_heads`` heads of ``index_head_dim`` queried from the
normed query latent (``wq_b``), one LayerNorm'd key (``wk``, ``k_norm``), ReLU'd scores weighted by
``weights_proj`` (float32) and summed; each query attends to the ``index_topk`` best past positions.

* DeepSeek-V3.2: every layer scores; the indexer rotates its first ``qk_rope_head_dim`` dims in
  halves (as the checkpoint lays them out).
* GLM-5: ``indexer_types`` (or the ``index_topk_pattern`` / ``index_topk_freq`` /
  ``index_skip_topk_offset`` schedule GlmMoeDsaConfig derives it from) marks the "full" layers that
  score; a "shared" layer has no indexer and reuses the previous full layer's selection. Its indexer
  rotates interleaved pairs, so the rotary rows of ``wq_b``, ``wk`` and ``k_norm`` are de-interleaved
  here (the LayerNorm over the permuted key is the permuted LayerNorm).

Ties between equal index scores go to the earlier position (`helios.abi.sparse_index`; the
reference's ``torch.topk`` leaves their order unspecified).

Refused by name: a null ``q_lora_rank`` (the indexer reads the query latent), ``rope_interleave``
false, an ``index_topk`` / ``index_n_heads`` / ``index_head_dim`` that is not a positive integer, an
``index_head_dim`` narrower than ``qk_rope_head_dim``, ``layer_types`` other than
"indexed_attention", ``indexer_types`` that are not "full"/"shared" per layer or start shared,
``attention_bias`` / ``mlp_bias``, fewer key/value heads than heads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.deepseek import check_key_heads, latent_architecture, latent_recipe, lite_experts
from helios.ignition.recipes.deepseek_v2 import _count
from helios.ignition.token_indexer import TokenIndexer

ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
_INDEXER_KINDS = ("full", "shared")  # GlmMoeDsaConfig.indexer_types
_PATTERN = {"F": "full", "S": "shared"}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    check_key_heads(config)
    if config.get("mlp_bias"):
        raise UnsupportedCheckpoint(f"{source} mlp_bias is not supported")
    if config.get("rope_interleave") is False:
        raise UnsupportedCheckpoint(f"{source} rope_interleave false is not supported (the reference always "
                                    f"rotates interleaved pairs)")
    kinds = config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or set(kinds) - {"indexed_attention"}):
        raise UnsupportedCheckpoint(f"layer_types {kinds!r:.120} are not all 'indexed_attention'")
    config = with_layer_kinds(config)
    base = latent_architecture(source, config, tensors, dtype, lite_experts(source, config))
    if not base.latent.q_lora_rank:
        raise UnsupportedCheckpoint(f"{source} needs a q_lora_rank (the indexer reads the query latent), got "
                                    f"{config.get('q_lora_rank')!r}")
    indexer = token_indexer(source, config, base.num_layers)
    arch = dataclasses.replace(base, indexer=indexer)
    interleaved = source == "GlmMoeDsaForCausalLM"
    return latent_recipe(source, arch, config, tensors, True, _indexer_weights(arch, tensors, interleaved))


def with_layer_kinds(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with DeepseekV32Config's default ``mlp_layer_types``: ``first_k_dense_replace`` dense
    layers (3 by default), then sparse ones."""
    config = dict(config)
    if config.get("mlp_layer_types") is None:
        layers = int(config["num_hidden_layers"])
        dense = min(int(config.get("first_k_dense_replace", 3)), layers)
        config["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (layers - dense)
    return config


def token_indexer(source: str, config: Mapping[str, Any], num_layers: int) -> TokenIndexer:
    """The indexer geometry the config declares (refusing what does not fit by name)."""
    heads, width, topk = (_count(config, key) for key in ("index_n_heads", "index_head_dim", "index_topk"))
    rope = int(config["qk_rope_head_dim"])
    if width < rope:
        raise UnsupportedCheckpoint(f"index_head_dim {width} is narrower than qk_rope_head_dim {rope} (the indexer "
                                    f"rotates its first qk_rope_head_dim dims)")
    layers = tuple(range(num_layers)) if source == "DeepseekV32ForCausalLM" else scoring_layers(config, num_layers)
    return TokenIndexer(num_heads=heads, head_dim=width, topk=topk, rope_dim=rope, layers=layers)


def scoring_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """GLM-5's "full" layers: ``indexer_types``, or the schedule GlmMoeDsaConfig derives it from."""
    kinds = config.get("indexer_types")
    if kinds is None:
        pattern = config.get("index_topk_pattern")
        if isinstance(pattern, str):
            if set(pattern) - set(_PATTERN):
                raise UnsupportedCheckpoint(f"index_topk_pattern {pattern!r:.120} must spell F and S only")
            kinds = [_PATTERN[c] for c in pattern]
        elif pattern is not None:
            kinds = pattern
        else:
            freq, offset = config.get("index_topk_freq", 1), config.get("index_skip_topk_offset", 2)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (freq, offset)):
                raise UnsupportedCheckpoint(f"index_topk_freq {freq!r} and index_skip_topk_offset {offset!r} must be "
                                            f"integers")
            freq = max(freq, 1)
            kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]
    if (not isinstance(kinds, list) or len(kinds) != num_layers or not set(kinds) <= set(_INDEXER_KINDS)
            or kinds[0] != "full"):
        raise UnsupportedCheckpoint(f"indexer_types {kinds!r:.120} must list {_INDEXER_KINDS} per layer "
                                    f"({num_layers}), the first 'full'")
    return tuple(i for i, kind in enumerate(kinds) if kind == "full")


def _indexer_weights(arch, tensors: CheckpointTensors, interleaved: bool):
    """The `latent_recipe` hook placing a scoring layer's indexer weights after its ``o.weight``."""
    indexer = arch.indexer
    rope, width = indexer.rope_dim, indexer.head_dim
    order = None
    if interleaved:  # pairs (x0, x1), (x2, x3).. of the rotary dims become halves; the rest stays
        order = torch.cat((torch.arange(0, rope, 2), torch.arange(1, rope, 2), torch.arange(rope, width)))

    def rows(tensor: torch.Tensor) -> torch.Tensor:
        """Each head's rows (or entries) of `tensor` [heads * D, ...] in the served order."""
        if order is None:
            return tensor
        return tensor.view(-1, width, *tensor.shape[1:])[:, order].reshape(tensor.shape).contiguous()

    def extra(layer: int, take) -> list[NamedWeight]:
        if indexer.plane_index(layer) is None:
            return []
        src, dst = f"model.layers.{layer}.self_attn.indexer.", f"layers.{layer}.indexer."
        take(src + "weights_proj.weight")  # placed float32, as the reference keeps it
        return [NamedWeight(dst + "q.weight", rows(take(src + "wq_b.weight"))),
                NamedWeight(dst + "k.weight", rows(take(src + "wk.weight"))),
                NamedWeight(dst + "k_norm", rows(take(src + "k_norm.weight"))),
                NamedWeight(dst + "k_norm_bias", rows(take(src + "k_norm.bias"))),
                NamedWeight(dst + "weights", tensors.get(src + "weights_proj.weight").to(torch.float32))]

    return extra
