"""Differential fuzzing of preparation over the configuration variants real checkpoints carry.

Each seed draws one tiny (2-layer, hidden <= 64) checkpoint of a family with varied settings: GQA
ratios, an explicit head_dim, tied embeddings, rope types and thetas (in the current
``rope_parameters`` layout or the legacy ``rope_theta`` / ``rope_scaling`` one), partial rotary,
biases, q/k norms, sliding windows, norm epsilons, activations, routing settings, odd vocabularies.
Each is prepared for a context of the prompt and its greedy tokens: Phi-3's LongRoPE draws an
original context those positions stay within (the short factor list) or one the prompt already
passes (the long list), the two cases where transformers takes one list on every forward.
Some variants are saved as older or terser checkpoints write config.json: the rope settings in the
legacy layout, no ``layer_types``, or every setting at its config class's default left out (the
reference fills those in). Preparing a variant must either give a model whose float32 prefill
logits, scored log-probabilities and greedy tokens equal transformers' on the same weights (eager
programs through the test driver), or refuse it with a `CheckpointError` (`UnsupportedCheckpoint`
mostly) naming one of the settings drawn: never a different model, never another exception.
`PINNED` keeps the variants the fuzz found defects in.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError
from helios.ignition.capture import build_program
from helios.ignition.program_spec import Capacity, Operation, program_spec
from helios.ignition.recipes import load_checkpoint

from support.bamba_reference import grouped_gated_norm
from support.sweeps import swept

from .driver import PagedModel, RowWork, Sequence, generate
from .hf_checkpoints import Family, random_model, write_checkpoint
from .test_equivalence import TOLERANCE, relative_error

PAGE_TOKENS = 4
PROMPT_LEN = 19  # longer than every drawn sliding window
NEW_TOKENS = 6


@dataclass(frozen=True)
class Variant:
    """One drawn checkpoint: the family and config overrides, and config.json rewrites after saving
    (`legacy`: the settings as older checkpoints spell them, written over what transformers saved)."""

    family: Family
    legacy: tuple[tuple[str, object], ...] = ()
    sparse: bool = False  # config.json leaves out every setting at its config class's default

    @property
    def fields(self) -> set[str]:
        """Every config key the variant sets (nested rope keys included): a refusal names one."""
        names = set()
        for key, value in (*self.family.overrides, *self.legacy):
            names.add(key)
            if isinstance(value, dict):
                names |= set(value)
        return names


def _choice(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def _attention_geometry(rng: random.Random, explicit_head_dim: bool = False) -> dict:
    """Heads, key/value heads (1, all, or between) and an explicit head_dim or none; Qwen3's
    config class defaults head_dim to 128, so its variants always set one."""
    heads = _choice(rng, (2, 4, 8))
    kv_heads = _choice(rng, [n for n in (1, 2, 4, 8) if heads % n == 0])
    hidden = _choice(rng, (32, 48, 64))
    head_dim = _choice(rng, (8, 12, 16, 24) if explicit_head_dim else (None, 8, 12, 16, 24))
    if head_dim is None and (hidden % heads or (hidden // heads) % 2):
        head_dim = 16
    return dict(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                **({} if head_dim is None else {"head_dim": head_dim}))


def _rope(rng: random.Random, kinds=("default", "default", "linear", "llama3", "yarn", "yarn", "dynamic", "longrope"),
          rotary_dim: int = 16) -> dict:
    """A rope_parameters dict; small thetas make every frequency turn within the prompt, no theta
    leaves the config class's default."""
    kind = _choice(rng, kinds)
    params = {"rope_type": kind}
    theta = _choice(rng, (None, 100.0, 10000.0, 1000000.0))
    if theta is not None:
        params["rope_theta"] = theta
    original = _choice(rng, (None, 16, 64))
    if kind == "linear":
        params["factor"] = _choice(rng, (2.0, 4.0))
    elif kind == "dynamic":
        params["factor"] = 2.0
    elif kind == "llama3":
        params.update(factor=_choice(rng, (2.0, 8.0)), low_freq_factor=1.0, high_freq_factor=4.0)
    elif kind == "yarn":
        params["factor"] = _choice(rng, (2.0, 4.0))
        if rng.random() < 0.5:
            params.update(beta_fast=_choice(rng, (8.0, 32.0)), beta_slow=1.0)
        if rng.random() < 0.3:
            params["attention_factor"] = 1.25
    elif kind == "longrope":
        params.update(short_factor=[1.0] * (rotary_dim // 2), long_factor=[2.0] * (rotary_dim // 2))
        original = original or 64
    if original is not None and kind != "default":
        params["original_max_position_embeddings"] = original
    return params


def _legacy_rope(rng: random.Random, rope: dict) -> tuple[tuple[str, object], ...]:
    """Half the time: the rope settings as pre-`rope_parameters` checkpoints write them (``rope_theta``
    and ``partial_rotary_factor`` beside ``rope_scaling``, ``type`` for ``rope_type``, no theta where
    the class default was drawn, sometimes Phi-3's top-level ``original_max_position_embeddings``)."""
    if rng.random() < 0.5:
        return ()
    top = {"rope_parameters": None}
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if "original_max_position_embeddings" in scaling and rng.random() < 0.5:
        top["original_max_position_embeddings"] = scaling.pop("original_max_position_embeddings")
    if scaling.get("rope_type") == "default":
        scaling = None
    elif rng.random() < 0.5:
        scaling["type"] = scaling.pop("rope_type")
    top["rope_scaling"] = scaling
    if scaling and rng.random() < 0.3:  # a stale rope_parameters beside it: transformers reads rope_scaling
        top["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in rope:
            top[key] = rope[key]
    return tuple(top.items())


def _unread_window(rng: random.Random) -> tuple[tuple[str, object], ...]:
    """A legacy ``sliding_window`` that the family's reference does not read, one draw in five."""
    return (("sliding_window", 5),) if rng.random() < 0.2 else ()


def _draw_partial_rotary(rng: random.Random, rope: dict, head_dim: int) -> None:
    """Sets a drawn ``partial_rotary_factor`` in `rope` (none a third of the time: the class default
    of 0.5), dropping one that leaves an odd rotated width or a width of 2 under dynamic rope."""
    partial = _choice(rng, (None, None, 0.5, 0.25, 0.75, 1.0))
    width = int(head_dim * (partial or 0.5))
    if width % 2 or (width == 2 and rope["rope_type"] == "dynamic"):  # the reference's YaRN (dynamic) breaks
        partial = None
    if partial is not None:
        rope["partial_rotary_factor"] = partial


DENSE = {
    "llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
}


def draw_dense(seed: int) -> Variant:
    rng = random.Random(seed)
    name = _choice(rng, sorted(DENSE))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131, 250)),
                  intermediate_size=_choice(rng, (32, 48, 80)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  **_attention_geometry(rng, name == "qwen3"))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if rng.random() < 0.1:
        config["hidden_act"] = _choice(rng, ("gelu", "gelu_pytorch_tanh"))
    partial = _choice(rng, (None,) * 7 + (0.5,))
    rope = _rope(rng, rotary_dim=int(head_dim * (partial or 1.0)))
    if partial:
        rope["partial_rotary_factor"] = partial
    config["rope_parameters"] = rope
    if name == "llama":
        config.update(attention_bias=rng.random() < 0.4, mlp_bias=rng.random() < 0.3)
    if name == "mistral":
        config["sliding_window"] = _choice(rng, (None, 5, 8, 4096))
    if name in ("qwen2", "qwen3"):
        if rng.random() < 0.5:
            config.update(use_sliding_window=True, sliding_window=_choice(rng, (5, 7, None)),
                          max_window_layers=_choice(rng, (0, 1, 2)))
        else:
            config.update(use_sliding_window=False, sliding_window=_choice(rng, (None, 4096)))
    if name == "qwen3" and rng.random() < 0.3:
        config["attention_bias"] = True
    legacy = _legacy_rope(rng, rope)
    if name in ("qwen2", "qwen3") and rng.random() < 0.5:  # older checkpoints: no layer_types
        legacy += (("layer_types", None),)
    if name == "llama" and config["num_key_value_heads"] == config["num_attention_heads"] and rng.random() < 0.5:
        legacy += (("num_key_value_heads", None),)  # Llama 1 and 2 configs
    return Variant(Family(f"{name}-{seed}", DENSE[name], tuple(config.items())), legacy, rng.random() < 0.3)


def draw_moe(seed: int) -> Variant:
    rng = random.Random(seed)
    name = _choice(rng, ("qwen3_moe", "mixtral", "glm4_moe"))
    experts = _choice(rng, (4, 6, 8))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)), intermediate_size=48,
                  rms_norm_eps=_choice(rng, (1e-6, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  max_position_embeddings=512, num_experts_per_tok=_choice(rng, (1, 2, 3)),
                  **_attention_geometry(rng, name == "qwen3_moe"))
    partial = _choice(rng, (0.5, 1.0) if name == "glm4_moe" else (None, None, None, 0.5))
    rope = _rope(rng, ("default", "linear", "yarn", "llama3"))
    if partial:
        rope["partial_rotary_factor"] = partial
    if name == "mixtral" and "head_dim" not in config:  # transformers' yarn reads Mixtral's head_dim (None)
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    if name == "qwen3_moe":
        config.update(num_experts=experts, moe_intermediate_size=_choice(rng, (16, 24)),
                      norm_topk_prob=rng.random() < 0.5, mlp_only_layers=_choice(rng, ([], [0])),
                      decoder_sparse_step=_choice(rng, (1, 1, 2)), use_sliding_window=rng.random() < 0.3,
                      sliding_window=_choice(rng, (6, 4096)), max_window_layers=_choice(rng, (0, 1, 2)))
    elif name == "mixtral":
        config.update(num_local_experts=experts, sliding_window=_choice(rng, (None, 6)))
    else:
        groups = _choice(rng, [g for g in (1, 2) if experts % g == 0])
        config.update(n_routed_experts=experts, moe_intermediate_size=_choice(rng, (16, 24)),
                      first_k_dense_replace=_choice(rng, (0, 1)), n_group=groups,
                      topk_group=_choice(rng, range(1, groups + 1)), n_shared_experts=_choice(rng, (0, 1, 2)),
                      routed_scaling_factor=_choice(rng, (1.0, 2.5)), norm_topk_prob=rng.random() < 0.5,
                      use_qk_norm=rng.random() < 0.5, attention_bias=rng.random() < 0.5)
        if config["num_experts_per_tok"] > experts // groups * config["topk_group"]:
            config["num_experts_per_tok"] = _choice(rng, (1, 1, 1, config["num_experts_per_tok"]))  # refused
    config["rope_parameters"] = rope
    cls = {"qwen3_moe": transformers.Qwen3MoeConfig, "mixtral": transformers.MixtralConfig,
           "glm4_moe": transformers.Glm4MoeConfig}[name]
    return Variant(Family(f"{name}-{seed}", cls, tuple(config.items())), _legacy_rope(rng, rope), rng.random() < 0.3)


def draw_deepseek(seed: int) -> Variant:
    rng = random.Random(seed)
    experts = _choice(rng, (4, 8))
    groups = _choice(rng, [g for g in (1, 2, 4) if experts % g == 0])
    rope_dim, heads = _choice(rng, (8, 16)), _choice(rng, (2, 4))  # latent attention: a key head per head
    rope = _rope(rng, ("default", "yarn", "linear"), rope_dim)
    if rope["rope_type"] == "yarn" and rng.random() < 0.5:
        rope.update(mscale=_choice(rng, (0.707, 1.0)), mscale_all_dim=_choice(rng, (0.707, 1.0)))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)), hidden_size=_choice(rng, (32, 64)),
                  intermediate_size=48, num_attention_heads=heads, num_key_value_heads=heads,
                  q_lora_rank=_choice(rng, (None, 16)), kv_lora_rank=_choice(rng, (16, 32)), qk_rope_head_dim=rope_dim,
                  qk_nope_head_dim=_choice(rng, (8, 16)), v_head_dim=_choice(rng, (8, 24)),
                  first_k_dense_replace=_choice(rng, (0, 1, 2)), n_routed_experts=experts,
                  num_experts_per_tok=_choice(rng, (1, 2)), n_group=groups,
                  topk_group=_choice(rng, range(1, groups + 1)),
                  n_shared_experts=_choice(rng, (0, 1, 2)), moe_intermediate_size=_choice(rng, (16, 24)),
                  routed_scaling_factor=_choice(rng, (1.0, 2.5)), norm_topk_prob=rng.random() < 0.7,
                  rope_interleave=rng.random() < 0.7, rms_norm_eps=_choice(rng, (1e-6, 0.1)),
                  tie_word_embeddings=rng.random() < 0.3, max_position_embeddings=512, rope_parameters=rope)
    if rng.random() < 0.1:
        config["attention_bias"] = True
    if config["num_experts_per_tok"] > experts // groups * config["topk_group"]:
        config["num_experts_per_tok"] = _choice(rng, (1, 1, 1, config["num_experts_per_tok"]))  # refused
    return Variant(Family(f"deepseek_v3-{seed}", transformers.DeepseekV3Config, tuple(config.items())),
                   _legacy_rope(rng, rope), rng.random() < 0.3)


def draw_latent(seed: int) -> Variant:
    """DeepSeek-V2 / V2-Lite (softmax routing, greedy or over groups scored by their best expert, never
    renormalised; rarely norm_topk_prob, moe_layer_freq 2 or another topk_method: refused) and
    GLM-4.7-Flash (DeepSeek-V3's dataflow, sparse layers by mlp_layer_types or its default, sometimes
    beside a first_k_dense_replace, agreeing or not, that neither it nor Helios reads); latent geometry with
    or without a query rank, default or YaRN rope with DeepSeek's mscale, rarely attention biases (refused)."""
    rng = random.Random(seed)
    name = _choice(rng, ("deepseek_v2", "deepseek_v2", "glm4_moe_lite"))
    experts, rope_dim, heads = _choice(rng, (4, 6, 8)), _choice(rng, (8, 16)), _choice(rng, (2, 4))
    rope = _rope(rng, ("default", "yarn", "yarn"), rope_dim)
    if rope["rope_type"] == "yarn" and rng.random() < 0.6:
        rope.update(mscale=_choice(rng, (0.707, 1.0)), mscale_all_dim=_choice(rng, (0.707, 1.0)))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)), hidden_size=_choice(rng, (32, 64)),
                  intermediate_size=48, num_attention_heads=heads, num_key_value_heads=heads,
                  q_lora_rank=_choice(rng, (None, 16)), kv_lora_rank=_choice(rng, (16, 32)), qk_rope_head_dim=rope_dim,
                  qk_nope_head_dim=_choice(rng, (8, 16)), v_head_dim=_choice(rng, (8, 24)), n_routed_experts=experts,
                  num_experts_per_tok=_choice(rng, (1, 2, 3)), moe_intermediate_size=_choice(rng, (16, 24)),
                  n_shared_experts=_choice(rng, (0, 1, 2)), routed_scaling_factor=_choice(rng, (1.0, 2.5, 16.0)),
                  rms_norm_eps=_choice(rng, (1e-6, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  max_position_embeddings=512, rope_parameters=rope)
    # GLM's sigmoid groups score their best two (a group of one is refused); DeepSeek-V2's their best one
    sizes = (1, 2, 3, 4) if name == "deepseek_v2" else (1, 2, 2, 4)
    groups, legacy = _choice(rng, [g for g in sizes if experts % g == 0]), ()
    if name == "deepseek_v2":
        method = "greedy" if groups == 1 else _choice(rng, ("greedy", "group_limited_greedy", "group_limited_greedy"))
        config.update(topk_method=method, first_k_dense_replace=_choice(rng, (0, 1, 2)))
        if method == "group_limited_greedy":
            config.update(n_group=groups, topk_group=_choice(rng, range(1, groups + 1)))
        if rng.random() < 0.08:
            config["norm_topk_prob"] = True
        if rng.random() < 0.05:
            config["topk_method"] = "noaux_tc"
        if rng.random() < 0.3:  # DeepSeek's own config.json spells the layer frequency
            legacy += (("moe_layer_freq", _choice(rng, (1, 1, 1, 2))),)
    else:
        config.update(n_group=groups, topk_group=_choice(rng, range(1, groups + 1)), norm_topk_prob=rng.random() < 0.7,
                      rope_interleave=rng.random() < 0.7)
        kinds = ["dense", "sparse"]  # Glm4MoeLiteConfig's default for 2 layers
        if rng.random() < 0.6:
            config["mlp_layer_types"] = kinds = [_choice(rng, ("dense", "sparse")) for _ in range(2)]
        if rng.random() < 0.3:  # the first dense layers, as GLM-4.5 spells them: agreeing or not
            agreeing = kinds.index("sparse") if "sparse" in kinds and kinds[-1] == "sparse" else 2
            legacy += (("first_k_dense_replace", _choice(rng, (agreeing, agreeing, agreeing, 0, 1))),)
    kept = experts // groups * int(config.get("topk_group") or 1)
    if config["num_experts_per_tok"] > kept and (name != "deepseek_v2" or "n_group" in config):
        config["num_experts_per_tok"] = _choice(rng, (1, 1, 1, config["num_experts_per_tok"]))  # refused
    if rng.random() < 0.05:
        config["attention_bias"] = True
    cls = transformers.DeepseekV2Config if name == "deepseek_v2" else transformers.Glm4MoeLiteConfig
    return Variant(Family(f"{name}-{seed}", cls, tuple(config.items())), legacy + _legacy_rope(rng, rope),
                   rng.random() < 0.3)


def draw_dots1(seed: int) -> Variant:
    """dots.llm1: Qwen3's attention (q/k norms always, biases or not, layer kinds by layer_types or, as
    older config.json files leave them out, derived from sliding_window / max_window_layers) with
    DeepSeek-V3's routing (sigmoid with the correction bias, groups, dense first layers, shared
    experts); Llama's rope types, rarely partial rotary (refused)."""
    rng = random.Random(seed)
    experts = _choice(rng, (4, 6, 8))
    groups = _choice(rng, [g for g in (1, 2) if experts % g == 0])
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)), intermediate_size=48,
                  rms_norm_eps=_choice(rng, (1e-6, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  max_position_embeddings=512, attention_bias=rng.random() < 0.4, n_routed_experts=experts,
                  num_experts_per_tok=_choice(rng, (1, 2, 3)), n_group=groups,
                  topk_group=_choice(rng, range(1, groups + 1)), n_shared_experts=_choice(rng, (0, 1, 2)),
                  moe_intermediate_size=_choice(rng, (16, 24)), first_k_dense_replace=_choice(rng, (0, 1)),
                  norm_topk_prob=rng.random() < 0.5, routed_scaling_factor=_choice(rng, (1.0, 2.5)),
                  sliding_window=_choice(rng, (None, 5, 8)), max_window_layers=_choice(rng, (0, 1, 2)),
                  **_attention_geometry(rng))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = _rope(rng, ("default", "linear", "llama3", "yarn"), head_dim)
    if rng.random() < 0.1:
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    if config["sliding_window"] is not None and rng.random() < 0.5:
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(2)]
    if config["num_experts_per_tok"] > experts // groups * config["topk_group"]:
        config["num_experts_per_tok"] = _choice(rng, (1, 1, 1, config["num_experts_per_tok"]))  # refused
    legacy = _legacy_rope(rng, rope)
    if "layer_types" not in config and rng.random() < 0.5:  # older checkpoints: the kinds Dots1Config derives
        legacy += (("layer_types", None),)
    return Variant(Family(f"dots1-{seed}", transformers.Dots1Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_gpt_oss(seed: int) -> Variant:
    rng = random.Random(seed)
    geometry = _attention_geometry(rng, explicit_head_dim=True)
    rope = _rope(rng, ("default", "yarn"), geometry["head_dim"])
    if rope["rope_type"] == "yarn" and rng.random() < 0.5:
        rope["truncate"] = False
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 131)), intermediate_size=_choice(rng, (16, 32)),
                  num_local_experts=_choice(rng, (2, 4)), num_experts_per_tok=_choice(rng, (1, 2)),
                  sliding_window=_choice(rng, (4, 6, 128)), swiglu_limit=_choice(rng, (1.0, 7.0)),
                  rms_norm_eps=_choice(rng, (1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  attention_bias=rng.random() < 0.7, max_position_embeddings=512, rope_parameters=rope, **geometry)
    if rng.random() < 0.5:
        config["layer_types"] = _choice(rng, (["full_attention", "sliding_attention"],
                                              ["sliding_attention", "sliding_attention"]))
    return Variant(Family(f"gpt_oss-{seed}", transformers.GptOssConfig, tuple(config.items())),
                   _legacy_rope(rng, rope), rng.random() < 0.3)


def draw_bamba(seed: int) -> Variant:
    rng = random.Random(seed)
    geometry = _attention_geometry(rng)
    rope = {"rope_type": "default", "rope_theta": _choice(rng, (100.0, 10000.0))}
    partial = _choice(rng, (None, 0.5, 1.0, 0.25))
    if partial is not None:
        rope["partial_rotary_factor"] = partial
    if rng.random() < 0.15:
        rope = _rope(rng, ("linear", "yarn"))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 131)), intermediate_size=_choice(rng, (32, 48)),
                  attn_layer_indices=[_choice(rng, (0, 1))], mamba_n_heads=_choice(rng, (2, 4)),
                  mamba_d_state=_choice(rng, (4, 8)), mamba_n_groups=_choice(rng, (1, 2)),
                  mamba_d_conv=_choice(rng, (2, 4)),
                  mamba_expand=2, mamba_chunk_size=8, rms_norm_eps=_choice(rng, (1e-5, 0.1)),
                  tie_word_embeddings=rng.random() < 0.3, mlp_bias=rng.random() < 0.2,
                  attention_bias=rng.random() < 0.2, max_position_embeddings=512, rope_parameters=rope,
                  mamba_conv_bias=rng.random() < 0.7, mamba_proj_bias=rng.random() < 0.3,
                  time_step_limit=_choice(rng, ((0.0, float("inf")), (0.01, 0.5))), **geometry)
    config["mamba_d_head"] = config["hidden_size"] * 2 // config["mamba_n_heads"]
    legacy = _legacy_rope(rng, rope)
    if legacy:  # BambaConfig sets a top-level partial_rotary_factor to 0.5 whatever config.json says
        config["rope_parameters"] = {**rope, "partial_rotary_factor": 0.5}
    return Variant(Family(f"bamba-{seed}", transformers.BambaConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_phi3(seed: int) -> Variant:
    """Phi-3's shapes: the default rope or LongRoPE (random per-pair factor lists; an original context
    the served 25 positions stay within, or one the 19-token prompt already passes, so the reference
    takes one list on every forward), partial rotary (Phi-4-mini's 0.75), sliding windows; the legacy
    layout sometimes with the "su" / "yarn" spellings Phi3Config reads as longrope."""
    rng = random.Random(seed)
    geometry = _attention_geometry(rng)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)),
                  tie_word_embeddings=rng.random() < 0.5, sliding_window=_choice(rng, (None, None, 5, 8, 2047)),
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **geometry)
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    rope = {"rope_type": _choice(rng, ("default", "longrope", "longrope")),
            "rope_theta": _choice(rng, (100.0, 10000.0))}
    partial = _choice(rng, (None, None, 0.5, 0.75))
    if rope["rope_type"] == "longrope":
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        config["hidden_size"] = head_dim * heads  # Phi3Config sizes the factor lists by hidden / heads
        if int(head_dim * (partial or 1.0)) % 2:
            partial = None
        pairs = int(head_dim * (partial or 1.0)) // 2
        rope.update(short_factor=[round(rng.uniform(1.0, 1.5), 3) for _ in range(pairs)],
                    long_factor=[round(rng.uniform(1.0, 8.0), 3) for _ in range(pairs)])
        if rng.random() < 0.2:
            rope["attention_factor"] = 1.25
        elif rng.random() < 0.2:
            rope["factor"] = 2.0
        original = _choice(rng, (None, 8, 16, 32, 64))
        if original is not None:
            config["original_max_position_embeddings"] = original
    if partial:
        rope["partial_rotary_factor"] = partial
    config["rope_parameters"] = rope
    legacy = dict(_legacy_rope(rng, rope))
    scaling = legacy.get("rope_scaling")
    if scaling and scaling.get("type") == "longrope" and rng.random() < 0.5:
        scaling["type"] = _choice(rng, ("su", "yarn"))
    return Variant(Family(f"phi3-{seed}", transformers.Phi3Config, tuple(config.items())), tuple(legacy.items()),
                   rng.random() < 0.3)


def draw_smollm3(seed: int) -> Variant:
    """SmolLM3's shapes: NoPE layers by an explicit ``no_rope_layers`` list (sometimes longer than the
    layers) or by ``no_rope_layer_interval``, windows on the NoPE layers (SmolLM3Config derives
    ``layer_types`` from use_sliding_window and the window), Llama's rope types and biases; older
    config.json sometimes without ``layer_types`` or with sliding layers written out."""
    rng = random.Random(seed)
    layers = _choice(rng, (2, 3))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  attention_bias=rng.random() < 0.3, mlp_bias=rng.random() < 0.2,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    rope = _rope(rng, rotary_dim=head_dim)
    if rng.random() < 0.1 and rope["rope_type"] != "longrope":  # its factor lists are sized for whole heads
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    if rng.random() < 0.5:
        config["no_rope_layers"] = [int(rng.random() < 0.6) for _ in range(layers + _choice(rng, (0, 0, 2)))]
    else:
        config["no_rope_layer_interval"] = _choice(rng, (1, 2, 3, 4))
    if rng.random() < 0.6:
        config.update(use_sliding_window=rng.random() < 0.8, sliding_window=_choice(rng, (None, 5, 8)))
    if rng.random() < 0.15:  # sliding layers of its own, with or without use_sliding_window
        config.update(layer_types=[_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)],
                      sliding_window=6)
    legacy = _legacy_rope(rng, rope)
    if "layer_types" not in config and rng.random() < 0.3:  # no layer_types: SmolLM3Config derives them again
        legacy += (("layer_types", None),)
    return Variant(Family(f"smollm3-{seed}", transformers.SmolLM3Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_gemma3(seed: int) -> Variant:
    """Gemma 3's shapes: sliding and full layers by ``layer_types`` or ``sliding_window_pattern``, windows
    under and over the prompt, query_pre_attn_scalar other than head_dim, a default or linear global
    rope beside the local one (rarely yarn, refused), a final logit soft cap, biases; rarely an
    attention soft cap or another activation (refused); the legacy layout (``rope_theta``,
    ``rope_local_base_freq``, ``rope_scaling``, no ``layer_types``) half the time."""
    rng = random.Random(seed)
    layers = _choice(rng, (2, 3, 4))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.7,
                  attention_bias=rng.random() < 0.3, sliding_window=_choice(rng, (3, 5, 8, 4096)),
                  **_attention_geometry(rng, explicit_head_dim=True))
    config["query_pre_attn_scalar"] = _choice(rng, (config["head_dim"], 24, 256, 1))
    pattern = _choice(rng, (1, 2, 3, 6)) if rng.random() < 0.6 else None
    if pattern is None:  # layer kinds of their own
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)]
    else:
        config["sliding_window_pattern"] = pattern
    if rng.random() < 0.3:
        config["final_logit_softcapping"] = _choice(rng, (5.0, 30.0))
    if rng.random() < 0.05:
        config["attn_logit_softcapping"] = 50.0
    if rng.random() < 0.05:
        config["hidden_activation"] = "gelu"
    full = _rope(rng, kinds=("default", "default", "linear", "linear", "yarn") if rng.random() < 0.1
                 else ("default", "linear"))
    full.setdefault("rope_theta", 1000000.0)
    local = {"rope_type": "default", "rope_theta": _choice(rng, (10.0, 100.0, 10000.0))}
    config["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
    legacy = ()
    if rng.random() < 0.5:  # a transformers 4 config.json
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        legacy = (("rope_parameters", None), ("rope_theta", full["rope_theta"]),
                  ("rope_local_base_freq", local["rope_theta"]),
                  ("rope_scaling", scaling if scaling["rope_type"] != "default" else None))
        if pattern is not None:  # the kinds Gemma3TextConfig derives from the pattern again
            legacy += (("layer_types", None),)
    return Variant(Family(f"gemma3-{seed}", transformers.Gemma3TextConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_llama_shaped(seed: int) -> Variant:
    """Seed-OSS (q/k/v, o and MLP biases each by its own switch) and Ernie 4.5 dense (one ``use_bias``
    for all, interleaved rotary pairs): Llama's rope types and geometry, a window in config.json that
    their references ignore."""
    rng = random.Random(seed)
    name = _choice(rng, ("seed_oss", "ernie4_5"))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng, True))
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    rope = _rope(rng, rotary_dim=config["head_dim"])
    if rng.random() < 0.1 and rope["rope_type"] != "longrope":  # its factor lists are sized for whole heads
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    if name == "seed_oss":
        config.update(attention_bias=rng.random() < 0.7, attention_out_bias=rng.random() < 0.3,
                      mlp_bias=rng.random() < 0.2)
    else:
        config["use_bias"] = rng.random() < 0.5
    legacy = _legacy_rope(rng, rope)
    if rng.random() < 0.2:  # a window the references do not read
        legacy += (("sliding_window", 5), ("layer_types", ["sliding_attention"] * 2))
    cls = {"seed_oss": transformers.SeedOssConfig, "ernie4_5": transformers.Ernie4_5Config}[name]
    return Variant(Family(f"{name}-{seed}", cls, tuple(config.items())), legacy, rng.random() < 0.3)


def draw_granite(seed: int) -> Variant:
    """Granite's multipliers (embedding, attention scale, residual, logits divisor; Granite 3's own
    values among them), Llama's rope types, biases and geometry, a window its reference ignores."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  attention_bias=rng.random() < 0.3, mlp_bias=rng.random() < 0.2,
                  embedding_multiplier=_choice(rng, (1.0, 12.0, 0.5)),
                  attention_multiplier=_choice(rng, (0.0078125, 0.015625, 0.3, 1.0)),
                  residual_multiplier=_choice(rng, (0.22, 1.0, 1.5, -0.5)),
                  logits_scaling=_choice(rng, (1.0, 8.0, 8.0, 0.25, -1.0, 0.0)),
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    rope = _rope(rng, rotary_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope) + _unread_window(rng)
    return Variant(Family(f"granite-{seed}", transformers.GraniteConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_hunyuan(seed: int) -> Variant:
    """Hunyuan dense: q/k norms after the rotation, NTK-alpha rope ("dynamic" with an alpha, sometimes
    without one: refused) or Llama's rope types, biases, an explicit head_dim (its reference needs one)."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  attention_bias=rng.random() < 0.3, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng, True))
    if rng.random() < 0.5:
        rope = {"rope_type": "dynamic", "alpha": _choice(rng, (1000.0, 50.0, 1.0, None)), "factor": 1.0}
        if rng.random() < 0.7:
            rope["rope_theta"] = _choice(rng, (100.0, 10000.0))
    else:
        rope = _rope(rng, ("default", "linear", "llama3", "yarn"), config["head_dim"])
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope)
    return Variant(Family(f"hunyuan-{seed}", transformers.HunYuanDenseV1Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_glm4(seed: int) -> Variant:
    """GLM-4 dense: interleaved partial rotary (the default 0.5 left out, or drawn: 0.25, 0.75, whole
    heads; an even rotated width), Llama's rope types (rarely dynamic: refused), q/k/v biases or none, an explicit head_dim
    (Glm4Config's default is 128); a window its reference does not read; rarely another activation."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  attention_bias=rng.random() < 0.7, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng, explicit_head_dim=True))
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn", "yarn", "dynamic"), config["head_dim"])
    _draw_partial_rotary(rng, rope, config["head_dim"])
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope)
    if rng.random() < 0.2:  # a window the reference does not read
        legacy += (("sliding_window", 5), ("layer_types", ["sliding_attention"] * 2))
    return Variant(Family(f"glm4-{seed}", transformers.Glm4Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_olmo(seed: int) -> Variant:
    """OLMo 2 (Llama's rope types, biases) and OLMo 3 (sliding and full layers by ``layer_types`` or the
    default pattern, windows under and over the prompt, a full-layer rope beside a default local one,
    rarely a scaled local rope: linear, or yarn, refused); the legacy layout (top-level ``rope_theta``
    and ``rope_scaling``; OLMo 3's sliding layers then keep theta 500000) half the time."""
    rng = random.Random(seed)
    is_olmo3 = rng.random() < 0.6
    layers = _choice(rng, (2, 3, 4)) if is_olmo3 else 2
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  attention_bias=rng.random() < 0.4, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng))
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    full = _rope(rng, ("default", "default", "linear", "llama3", "yarn", "dynamic"), head_dim)
    if not is_olmo3:
        config["rope_parameters"] = full
        return Variant(Family(f"olmo2-{seed}", transformers.Olmo2Config, tuple(config.items())),
                       _legacy_rope(rng, full), rng.random() < 0.3)
    is_legacy = rng.random() < 0.5
    full.setdefault("rope_theta", 500000.0)
    local = {"rope_type": "default", "rope_theta": 500000.0 if is_legacy else _choice(rng, (10.0, 100.0, 10000.0))}
    if not is_legacy and rng.random() < 0.1:
        local.update(_choice(rng, ({"rope_type": "linear", "factor": 2.0},
                                   {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16})))
    config.update(rope_parameters={"full_attention": full, "sliding_attention": local},
                  sliding_window=_choice(rng, (3, 5, 8, 4096, 4096, None) if rng.random() < 0.1 else (3, 5, 8, 4096)))
    if rng.random() < 0.6:
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)]
    legacy = ()
    if is_legacy:  # a transformers 4 config.json
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        legacy = (("rope_parameters", None), ("rope_theta", full["rope_theta"]),
                  ("rope_scaling", scaling if scaling["rope_type"] != "default" else None))
        if "layer_types" not in config:  # the kinds Olmo3Config derives again
            legacy += (("layer_types", None),)
    return Variant(Family(f"olmo3-{seed}", transformers.Olmo3Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_qwen2_moe(seed: int) -> Variant:
    """Qwen2-MoE: softmax top-k with or without renormalisation, dense layers by ``mlp_only_layers`` or
    ``decoder_sparse_step`` (sometimes none sparse: refused), a gated shared expert (rarely of width 0:
    refused), q/k/v biases or none, sliding layers by ``use_sliding_window`` and ``max_window_layers`` or
    by ``layer_types`` (sliding kinds without the switch: refused), no ``layer_types`` half the time
    (Qwen1.5-MoE's config.json), Llama's rope types (rarely partial: refused), rarely another activation."""
    rng = random.Random(seed)
    layers = _choice(rng, (2, 3))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  num_experts=_choice(rng, (4, 6, 8)), num_experts_per_tok=_choice(rng, (1, 2, 3)),
                  moe_intermediate_size=_choice(rng, (16, 24)),
                  shared_expert_intermediate_size=_choice(rng, (16, 32, 32, 32, 0) if rng.random() < 0.2 else (16, 32)),
                  norm_topk_prob=rng.random() < 0.5, mlp_only_layers=_choice(rng, ([], [], [0], [1])),
                  decoder_sparse_step=_choice(rng, (1, 1, 2)), qkv_bias=rng.random() < 0.8,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn"), head_dim)
    if rng.random() < 0.1:
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    if rng.random() < 0.5:
        config.update(use_sliding_window=True, sliding_window=_choice(rng, (3, 5, 8)),
                      max_window_layers=_choice(rng, (0, 1, 2, 28)))
    legacy = _legacy_rope(rng, rope)
    if rng.random() < 0.5:  # Qwen1.5-MoE's config.json: the kinds Qwen2MoeConfig derives
        legacy += (("layer_types", None),)
    elif rng.random() < 0.2:  # kinds of its own (the reference's too)
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)]
    return Variant(Family(f"qwen2_moe-{seed}", transformers.Qwen2MoeConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_olmoe(seed: int) -> Variant:
    """OLMoE: whole-projection q/k norms, softmax top-k with or without renormalisation in every layer,
    q/k/v/o biases or none, Llama's rope types (rarely partial: refused), a window its reference does
    not read; rarely ``clip_qkv``, an explicit head_dim other than hidden / heads or another activation
    (refused)."""
    rng = random.Random(seed)
    heads = _choice(rng, (2, 4, 8))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)), hidden_size=_choice(rng, (32, 48, 64)),
                  num_attention_heads=heads, num_key_value_heads=_choice(rng, [n for n in (1, 2, 4, 8) if heads % n == 0]),
                  intermediate_size=_choice(rng, (16, 32)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  num_experts=_choice(rng, (4, 6, 8)), num_experts_per_tok=_choice(rng, (1, 2, 3)),
                  norm_topk_prob=rng.random() < 0.5, attention_bias=rng.random() < 0.3,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None)
    head_dim = config["hidden_size"] // heads
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    if rng.random() < 0.05:
        config["clip_qkv"] = 2.0
    if rng.random() < 0.05:
        config["head_dim"] = 2 * head_dim
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn"), head_dim)
    if rng.random() < 0.1:
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope) + _unread_window(rng)
    return Variant(Family(f"olmoe-{seed}", transformers.OlmoeConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_cohere(seed: int) -> Variant:
    """Cohere (per-head q/k LayerNorms or none) and Cohere2 (sliding and full layers by ``layer_types``,
    the default pattern or a legacy ``sliding_window_pattern``, windows under and over the prompt, rarely
    none: refused): q/k/v/o biases or none, a drawn
    ``logit_scale`` (negative too) and ``layer_norm_eps``, tied or untied, Llama's rope types (rarely
    dynamic or a partial factor: refused), the legacy rope layout half the time; rarely another activation."""
    rng = random.Random(seed)
    is_cohere2 = rng.random() < 0.5
    layers = _choice(rng, (2, 3, 4)) if is_cohere2 else 2
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  layer_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), logit_scale=_choice(rng, (0.0625, 0.25, 1.0, -0.5)),
                  tie_word_embeddings=rng.random() < 0.6, attention_bias=rng.random() < 0.4, pad_token_id=None,
                  bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    if rng.random() < 0.05:
        config["hidden_act"] = "gelu"
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn", "dynamic"), head_dim)
    if rng.random() < 0.1 and not (rope["rope_type"] == "dynamic" and head_dim == 4):  # (the reference's breaks)
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope)
    if not is_cohere2:
        config["use_qk_norm"] = rng.random() < 0.5
        return Variant(Family(f"cohere-{seed}", transformers.CohereConfig, tuple(config.items())), legacy,
                       rng.random() < 0.3)
    config["sliding_window"] = _choice(rng, (3, 5, 8, 4096, None) if rng.random() < 0.1 else (3, 5, 8, 4096))
    kinds = rng.random()
    if kinds < 0.5:
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)]
    elif kinds < 0.75:  # the legacy pattern, which Cohere2Config turns into the reference's layer_types
        pattern = _choice(rng, (1, 2, 3))
        config["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        legacy += (("layer_types", None), ("sliding_window_pattern", pattern))
    else:
        legacy += (("layer_types", None),)
    return Variant(Family(f"cohere2-{seed}", transformers.Cohere2Config, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_granite_moe(seed: int) -> Variant:
    """Granite MoE and Granite MoE Shared: Granite's multipliers (as `draw_granite`), a mixture in every
    layer weighted by the softmax of its top-k logits, the shared variant's shared expert (or none: width
    0), Llama's rope types, q/k/v/o biases, a window its reference ignores."""
    rng = random.Random(seed)
    is_shared = rng.random() < 0.5
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (16, 32)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  attention_bias=rng.random() < 0.3, num_local_experts=_choice(rng, (4, 6, 8)),
                  num_experts_per_tok=_choice(rng, (1, 2, 3)),
                  embedding_multiplier=_choice(rng, (1.0, 12.0, 0.5)),
                  attention_multiplier=_choice(rng, (0.0078125, 0.015625, 0.3, 1.0)),
                  residual_multiplier=_choice(rng, (0.22, 1.0, 1.5, -0.5)),
                  logits_scaling=_choice(rng, (1.0, 8.0, 0.25, -1.0)),
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    if is_shared:
        config["shared_intermediate_size"] = _choice(rng, (0, 16, 32, 32))
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn"),
                 config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope) + _unread_window(rng)
    cls = transformers.GraniteMoeSharedConfig if is_shared else transformers.GraniteMoeConfig
    name = "granite_moe_shared" if is_shared else "granite_moe"
    return Variant(Family(f"{name}-{seed}", cls, tuple(config.items())), legacy, rng.random() < 0.3)


def draw_starcoder2(seed: int) -> Variant:
    """StarCoder2: ``use_bias`` or none, a window under or over the prompt or none, ``norm_epsilon``,
    tied or untied, ``gelu_pytorch_tanh`` (rarely silu, or gelu: refused), Llama's rope types (rarely
    dynamic or a partial factor: refused), the legacy rope layout half the time."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)), norm_epsilon=_choice(rng, (1e-6, 1e-5, 0.1)),
                  tie_word_embeddings=rng.random() < 0.5, use_bias=rng.random() < 0.7,
                  sliding_window=_choice(rng, (None, 3, 5, 8, 4096)), pad_token_id=None, bos_token_id=None,
                  eos_token_id=None, **_attention_geometry(rng))
    activation = rng.random()
    if activation < 0.15:
        config["hidden_act"] = "silu" if activation < 0.1 else "gelu"
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn", "dynamic"), head_dim)
    if rng.random() < 0.1 and not (rope["rope_type"] == "dynamic" and head_dim == 4):  # (the reference's breaks)
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    return Variant(Family(f"starcoder2-{seed}", transformers.Starcoder2Config, tuple(config.items())),
                   _legacy_rope(rng, rope), rng.random() < 0.3)


def draw_hunyuan_moe(seed: int) -> Variant:
    """Hunyuan MoE: `draw_hunyuan`'s attention (q/k norms after the rotation, NTK-alpha or Llama's rope
    types, biases, an explicit head_dim) with a mixture in every layer (softmax top-k renormalised, a
    shared expert of the experts' width), ``moe_topk`` as a number or a per-layer list (rarely uneven:
    refused)."""
    base = dict(draw_hunyuan(seed).family.overrides)
    rng = random.Random(f"hunyuan_moe-{seed}")
    top_k = _choice(rng, (1, 2, 3))
    base.update(num_experts=_choice(rng, (4, 6, 8)), intermediate_size=_choice(rng, (16, 32)),
                moe_topk=_choice(rng, (top_k, top_k, top_k, [top_k] * 2, [top_k, 1] if top_k > 1 else top_k)),
                eod_token_id=None, sep_token_id=None)
    return Variant(Family(f"hunyuan_moe-{seed}", transformers.HunYuanMoEV1Config, tuple(base.items())),
                   draw_hunyuan(seed).legacy, rng.random() < 0.3)


def draw_phi2(seed: int) -> Variant:
    """Phi-1 / Phi-2: partial rotary (the default 0.5 left out, or drawn: 0.25, 0.75, whole heads; an
    even rotated width), ``layer_norm_eps``, tied or untied, ``gelu_new`` (rarely gelu_pytorch_tanh or
    silu, or gelu: refused), rarely ``qk_layernorm`` (refused), Llama's rope types (rarely dynamic:
    refused), an explicit head_dim, the legacy rope layout half the time."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  layer_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng, explicit_head_dim=True))
    if rng.random() < 0.2:
        config["hidden_act"] = _choice(rng, ("gelu_pytorch_tanh", "silu", "gelu"))
    if rng.random() < 0.05:
        config["qk_layernorm"] = True
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn", "dynamic"), config["head_dim"])
    _draw_partial_rotary(rng, rope, config["head_dim"])
    config["rope_parameters"] = rope
    return Variant(Family(f"phi2-{seed}", transformers.PhiConfig, tuple(config.items())), _legacy_rope(rng, rope),
                   rng.random() < 0.3)


def draw_ernie4_5_moe(seed: int) -> Variant:
    """Ernie 4.5 MoE: interleaved rotary pairs (Llama's rope types, rarely partial: refused), sparse layers
    by ``moe_layer_start_index`` / ``moe_layer_interval`` (sometimes none: refused), softmax routing with a
    random correction bias, none to two shared experts; rarely ``use_bias``, a binding ``moe_norm_min``
    or another activation (refused)."""
    rng = random.Random(seed)
    config = dict(num_hidden_layers=_choice(rng, (2, 3)), vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.5,
                  moe_num_experts=_choice(rng, (4, 6, 8)), moe_k=_choice(rng, (1, 2, 3)),
                  moe_intermediate_size=_choice(rng, (16, 24)), moe_num_shared_experts=_choice(rng, (0, 1, 2)),
                  moe_layer_start_index=_choice(rng, (0, 1)), moe_layer_interval=_choice(rng, (1, 1, 2)),
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng))
    for key, value in (("use_bias", True), ("moe_norm_min", 0.9), ("hidden_act", "gelu")):
        if rng.random() < 0.04:
            config[key] = value
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = _rope(rng, ("default", "default", "linear", "llama3", "yarn"), head_dim)
    if rng.random() < 0.1:
        rope["partial_rotary_factor"] = 0.5
    config["rope_parameters"] = rope
    return Variant(Family(f"ernie4_5_moe-{seed}", transformers.Ernie4_5_MoeConfig, tuple(config.items())),
                   _legacy_rope(rng, rope), rng.random() < 0.3)


DRAWS = {"dense": draw_dense, "moe": draw_moe, "deepseek": draw_deepseek,
         "latent": draw_latent, "dots1": draw_dots1, "gpt_oss": draw_gpt_oss, "bamba": draw_bamba,
         "phi3": draw_phi3, "smollm3": draw_smollm3, "gemma3": draw_gemma3, "llama_shaped": draw_llama_shaped,
         "granite": draw_granite, "hunyuan": draw_hunyuan, "glm4": draw_glm4, "olmo": draw_olmo,
         "cohere": draw_cohere, "starcoder2": draw_starcoder2, "phi2": draw_phi2,
         "qwen2_moe": draw_qwen2_moe, "olmoe": draw_olmoe, "granite_moe": draw_granite_moe,
         "hunyuan_moe": draw_hunyuan_moe, "ernie4_5_moe": draw_ernie4_5_moe}


# ---------------------------------------------------------------------------------------------------


def _materialize(variant: Variant, directory: Path):
    """(reference model, checkpoint directory) of `variant`."""
    reference = random_model(variant.family, seed=7)
    grouped_gated_norm(reference)  # Mamba2's grouped norm on transformers releases without it
    write_checkpoint(reference, directory)
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in variant.legacy:
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    if variant.sparse:  # as hand-written configs do: the reference fills in its class defaults
        defaults = json.loads(variant.family.config_class().to_json_string(use_diff=False))
        config = {key: value for key, value in config.items()
                  if key in _KEPT or key not in defaults or defaults[key] != value}
    path.write_text(json.dumps(config))
    return reference, directory


_KEPT = ("architectures", "model_type", "transformers_version", "dtype")


def _programs(arch):
    variants = ((Operation.PREFILL, Capacity(1, 32)), (Operation.DECODE, Capacity(1, 1)),
                (Operation.MIXED, Capacity(1, 32)))
    if arch.recurrent is None:  # hybrid decoders have no scoring program
        variants += ((Operation.SCORED_PREFILL, Capacity(1, 32)),)
    return {op: (program_spec(arch, op, capacity, PAGE_TOKENS), build_program(arch, op, PAGE_TOKENS))
            for op, capacity in variants}


def check_variant(variant: Variant, directory: Path) -> str:
    """'refused: <reason>' or 'matches'; raises AssertionError where Helios and transformers differ."""
    reference, directory = _materialize(variant, directory)
    try:  # served context: the prompt and its greedy tokens (Phi-3's LongRoPE list follows it)
        recipe = load_checkpoint(directory, context_tokens=PROMPT_LEN + NEW_TOKENS)
    except CheckpointError as error:  # UnsupportedCheckpoint among them
        named = [field for field in variant.fields if field in str(error)]
        assert named, f"refusal names none of the drawn settings {sorted(variant.fields)}: {error}"
        return f"refused: {error}"
    vocab = recipe.architecture.vocab_size
    prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=torch.Generator().manual_seed(11)).tolist()
    logits = _reference_logits(reference, prompt)
    greedy, greedy_logits = _reference_greedy(reference, prompt)
    model = PagedModel(recipe.weight_tensors, _programs(recipe.architecture))
    if Operation.SCORED_PREFILL in model.programs:
        scored = Sequence(0, list(prompt))
        model.admit(scored, PROMPT_LEN)
        targets = prompt[1:] + [int(logits[-1].argmax())]
        outputs = model.run(Operation.SCORED_PREFILL, [RowWork(scored, tuple(prompt), 0, sample=True,
                                                               targets=tuple(targets))])
        expected = torch.log_softmax(logits, dim=-1)[torch.arange(PROMPT_LEN), torch.tensor(targets)]
        assert relative_error(outputs["logits"][0], logits[-1]) < TOLERANCE, "last prompt token's logits differ"
        torch.testing.assert_close(outputs["target_logprobs"][:PROMPT_LEN], expected, rtol=TOLERANCE,
                                   atol=TOLERANCE, msg="scored log-probabilities differ")
    sequence = Sequence(1, list(prompt))
    generate(model, [sequence], NEW_TOKENS, chunk=8)
    assert sequence.generated == greedy, "greedy tokens differ"
    assert relative_error(torch.stack(sequence.logits), greedy_logits) < TOLERANCE, "greedy logits differ"
    return "matches"


def _reference_logits(reference, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.tensor([token_ids])).logits[0]


def _reference_greedy(reference, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """The reference's greedy tokens and the logits behind each, every step a full forward over the
    sequence so far. (Its cached generation is the same for attention, but Bamba's cached mixer step
    skips ``time_step_limit``, which its full forward applies, as Mamba2's own step and chunked scan
    differ; Helios applies the limit in every program, as the full forward does.)"""
    tokens, rows = list(prompt), []
    for _ in range(NEW_TOKENS):
        rows.append(_reference_logits(reference, tokens)[-1])
        tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], torch.stack(rows)


# ---------------------------------------------------------------------------------------------------
# The fuzz: a fixed set of seeds per family (each family's draw is its own stream of seeds).

SWEEP = "HELIOS_CONFIG_FUZZ_SWEEP"


def _seeds(count: int, variable: str | None = None) -> range:
    """A family's seeds: `variable`'s count where it is set (a wider sweep of one family), all `count` in the
    HELIOS_CONFIG_FUZZ_SWEEP sweep, else the first quarter of them (every family keeps its draws' code paths
    by default: each seed is one more random configuration on the same ones, and PINNED keeps the
    configurations the sweeps found defects in)."""
    if variable and os.environ.get(variable):
        return range(int(os.environ[variable]))
    return range(count if swept(SWEEP) else -(-count // 4))


_LLAMA_SHAPED_SEEDS = _seeds(16, "HELIOS_LLAMA_SHAPED_FUZZ_SEEDS")
_GLM_OLMO_SEEDS = _seeds(8, "HELIOS_GLM_OLMO_FUZZ_SEEDS")
_COHERE_SEEDS = _seeds(8, "HELIOS_COHERE_FUZZ_SEEDS")  # (StarCoder2's, Phi-2's)
_LATENT_SEEDS = _seeds(8, "HELIOS_LATENT_FUZZ_SEEDS")
_MOE_FAMILY_SEEDS = _seeds(6, "HELIOS_MOE_FAMILY_FUZZ_SEEDS")
SEEDS = {"dense": _seeds(40), "moe": _seeds(28), "deepseek": _seeds(14),
         "latent": _LATENT_SEEDS, "dots1": _LATENT_SEEDS, "gpt_oss": _seeds(10), "bamba": _seeds(12),
         "phi3": _seeds(16), "smollm3": _LLAMA_SHAPED_SEEDS, "llama_shaped": _LLAMA_SHAPED_SEEDS,
         "granite": _LLAMA_SHAPED_SEEDS, "hunyuan": _LLAMA_SHAPED_SEEDS,
         "gemma3": _seeds(12, "HELIOS_GEMMA3_FUZZ_SEEDS"),
         "glm4": _GLM_OLMO_SEEDS, "olmo": _GLM_OLMO_SEEDS, "cohere": _COHERE_SEEDS, "starcoder2": _COHERE_SEEDS,
         "phi2": _COHERE_SEEDS, "qwen2_moe": _MOE_FAMILY_SEEDS,
         "olmoe": _MOE_FAMILY_SEEDS, "granite_moe": _MOE_FAMILY_SEEDS,
         "hunyuan_moe": _MOE_FAMILY_SEEDS, "ernie4_5_moe": _MOE_FAMILY_SEEDS}


def draw_gemma(seed: int) -> Variant:
    """Gemma 1 or Gemma 2 (half each): an explicit head_dim other than hidden / heads mostly, biases, tied or
    not, Llama's rope types (rarely one Llama's recipe refuses) in either layout. Gemma 1: the activation
    as "gelu_pytorch_tanh" or the legacy "gelu", sometimes an older ``hidden_activation`` beside it (rarely
    another: refused). Gemma 2: ``layer_types`` of its own or Gemma2Config's alternating default, windows
    under and over the prompt, query_pre_attn_scalar other than head_dim, an attention soft cap (null, 1,
    5 or 50) and a final one (null, 5 or 30); rarely a non-positive cap or another activation (refused)."""
    rng = random.Random(seed)
    gemma2 = rng.random() < 0.5
    layers = _choice(rng, (2, 3))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128)), intermediate_size=_choice(rng, (32, 48)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.7,
                  attention_bias=rng.random() < 0.3, **_attention_geometry(rng, explicit_head_dim=True))
    rope = _rope(rng, kinds=("default", "default", "linear", "llama3", "yarn", "dynamic") if rng.random() < 0.2
                 else ("default", "linear"), rotary_dim=config["head_dim"])
    config["rope_parameters"] = rope
    if not gemma2:
        config["hidden_act"] = _choice(rng, ("gelu_pytorch_tanh", "gelu", "gelu", "silu" if rng.random() < 0.1
                                             else "gelu"))
        if rng.random() < 0.3:
            config["hidden_activation"] = "gelu_pytorch_tanh" if rng.random() < 0.8 else "relu"
        return Variant(Family(f"gemma-{seed}", transformers.GemmaConfig, tuple(config.items())),
                       _legacy_rope(rng, rope), rng.random() < 0.3)
    config.update(sliding_window=_choice(rng, (3, 5, 8, 4096)),
                  query_pre_attn_scalar=_choice(rng, (config["head_dim"], 24, 256, 1)),
                  attn_logit_softcapping=_choice(rng, (None, 1.0, 5.0, 50.0)),
                  final_logit_softcapping=_choice(rng, (None, 5.0, 30.0)))
    if rng.random() < 0.5:
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention")) for _ in range(layers)]
    if rng.random() < 0.05:
        config["attn_logit_softcapping"] = _choice(rng, (0.0, -1.0))
    if rng.random() < 0.05:
        config["hidden_activation"] = "gelu"
    return Variant(Family(f"gemma2-{seed}", transformers.Gemma2Config, tuple(config.items())),
                   _legacy_rope(rng, rope), rng.random() < 0.3)


DRAWS["gemma"] = draw_gemma
SEEDS["gemma"] = _seeds(8, "HELIOS_GEMMA_FUZZ_SEEDS")


def draw_qwen3_next(seed: int) -> Variant:
    """Qwen3-Next, or a Qwen3.5 text decoder (dense or experts in every layer): Gated DeltaNet layers of 1-2
    key heads with 1-2 value heads each, head widths and convolution kernels, gated attention of any head
    geometry with partial rotary 0.25 / 0.5 / 1 (an odd rotated width: refused), ``layer_types`` or
    Qwen3NextConfig's ``full_attention_interval`` (rarely no attention layer: refused), biases, tied or not;
    Qwen3-Next's experts (none, or 4 with top-1/2, normalised or not, decoder_sparse_step, mlp_only_layers)
    and its gated shared expert; rarely a rope type other than the default (refused)."""
    rng = random.Random(seed)
    kind = _choice(rng, ("next", "next", "qwen3_5", "qwen3_5_moe"))
    layers = _choice(rng, (2, 3))
    key_heads = _choice(rng, (1, 2))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128)), rms_norm_eps=_choice(rng, (1e-6, 0.1)),
                  tie_word_embeddings=rng.random() < 0.3, attention_bias=rng.random() < 0.3, max_position_embeddings=512,
                  linear_num_key_heads=key_heads, linear_num_value_heads=key_heads * _choice(rng, (1, 2)),
                  linear_key_head_dim=_choice(rng, (4, 8)), linear_value_head_dim=_choice(rng, (4, 6, 8)),
                  linear_conv_kernel_dim=_choice(rng, (2, 3, 4)), **_attention_geometry(rng, explicit_head_dim=True))
    rope = {"rope_type": "default", "rope_theta": _choice(rng, (100.0, 10000.0)),
            "partial_rotary_factor": _choice(rng, (0.25, 0.5, 1.0))}
    if rng.random() < 0.1:
        rope.update(rope_type="linear", factor=2.0)
    config["rope_parameters"] = rope
    legacy: tuple = ()
    if rng.random() < 0.3:  # the kinds as Qwen3NextConfig derives them (config.json without layer_types)
        interval = _choice(rng, range(2, layers + 1)) if rng.random() < 0.95 else 1
        config["full_attention_interval"] = interval
        legacy = (("layer_types", None), ("full_attention_interval", interval))
    else:
        kinds = ["linear_attention"] * layers
        if rng.random() < 0.95:
            kinds[rng.randrange(layers)] = "full_attention"
        config["layer_types"] = kinds
    experts = dict(num_experts=4, num_experts_per_tok=_choice(rng, (1, 2)), moe_intermediate_size=_choice(rng, (16, 32)),
                   shared_expert_intermediate_size=_choice(rng, (16, 32)))
    if kind == "qwen3_5_moe":
        config.update(experts)
        return Variant(Family(f"qwen3_5_moe-{seed}", transformers.Qwen3_5MoeTextConfig, tuple(config.items())),
                       legacy, rng.random() < 0.3)
    config["intermediate_size"] = _choice(rng, (32, 48))
    if kind == "qwen3_5":
        return Variant(Family(f"qwen3_5-{seed}", transformers.Qwen3_5TextConfig, tuple(config.items())),
                       legacy, rng.random() < 0.3)
    if rng.random() < 0.9:  # num_experts 0 (dense throughout) is refused by load_checkpoint's count check
        config.update(experts, norm_topk_prob=rng.random() < 0.5, decoder_sparse_step=_choice(rng, (1, 1, 2)),
                      mlp_only_layers=[layer for layer in range(layers) if rng.random() < 0.3])
    else:  # (with a top-k: the rank fuzz redraws the expert count of every draw that has one)
        config.update(num_experts=0, num_experts_per_tok=1)
    return Variant(Family(f"qwen3_next-{seed}", transformers.Qwen3NextConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


DRAWS["qwen3_next"] = draw_qwen3_next
SEEDS["qwen3_next"] = _seeds(6, "HELIOS_QWEN3_NEXT_FUZZ_SEEDS")


@pytest.mark.parametrize("kind, seed", [(kind, seed) for kind, seeds in SEEDS.items() for seed in seeds],
                         ids=lambda value: str(value))
def test_a_drawn_configuration_matches_the_reference_or_is_refused_by_name(tmp_path, kind, seed):
    check_variant(DRAWS[kind](seed), tmp_path)


# ---------------------------------------------------------------------------------------------------
# Variants the fuzz found defects in, pinned (each failed before its fix).

_TINY = dict(num_hidden_layers=2, vocab_size=97, hidden_size=32, intermediate_size=48, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
_GLM = dict(_TINY, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            first_k_dense_replace=0, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            use_qk_norm=True, attention_bias=True)
_DEEPSEEK = dict(_TINY, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=0, n_routed_experts=4,
                 num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=16, routed_scaling_factor=1.0)
_YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 64}


def _variant(name: str, config_class, overrides: dict, legacy: dict | None = None, sparse: bool = False) -> Variant:
    return Variant(Family(name, config_class, tuple(overrides.items())), tuple((legacy or {}).items()), sparse)


PINNED = {
    # YaRN on a Llama-family checkpoint (Qwen2.5's long-context spelling): refused before
    "qwen2-yarn-legacy": (_variant("qwen2-yarn", transformers.Qwen2Config, dict(_TINY, rope_parameters=_YARN),
                                   {"rope_parameters": None, "rope_theta": 100.0,
                                    "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 64}}), "matches"),
    # Llama 3's context spelled at the top level (Phi-3's way): transformers reads it before the rope dict's
    "llama3-top-level-original-context": (_variant(
        "llama3-top", transformers.LlamaConfig,
        dict(_TINY, rope_parameters={"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        {"rope_parameters": None, "rope_theta": 100.0, "original_max_position_embeddings": 16,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 500}}), "matches"),
    # Qwen3-MoE's reference rotates whole heads whatever partial_rotary_factor says: it was rotated in part
    "qwen3_moe-partial-rotary": (_variant("qwen3_moe-partial", transformers.Qwen3MoeConfig, dict(
        _TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5})),
        "partial_rotary_factor 0.5 is not supported"),
    # YaRN's attention factor scaled GLM's pass-through (unrotated) dimensions too
    "glm4_moe-partial-yarn": (_variant("glm4_moe-yarn", transformers.Glm4MoeConfig,
                                       dict(_GLM, rope_parameters={**_YARN, "partial_rotary_factor": 0.5})), "matches"),
    # n_shared_experts 0: transformers saves zero-width shared-expert tensors, which were refused as unused
    "glm4_moe-no-shared-expert": (_variant("glm4_moe-unshared", transformers.Glm4MoeConfig,
                                           dict(_GLM, n_shared_experts=0)), "matches"),
    "deepseek-no-shared-expert": (_variant("deepseek-unshared", transformers.DeepseekV3Config,
                                           dict(_DEEPSEEK, n_shared_experts=0)), "matches"),
    # Settings left out of config.json at the reference class's default (Mixtral's rope_theta 1e6 and
    # rms_norm_eps 1e-5, GLM's partial_rotary_factor 0.5 and shared expert, DeepSeek's scaling 2.5)
    "mixtral-terse-config": (_variant("mixtral-terse", transformers.MixtralConfig, dict(
        _TINY, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), sparse=True), "matches"),
    "glm4_moe-terse-config": (_variant("glm4_moe-terse", transformers.Glm4MoeConfig, dict(
        _GLM, n_shared_experts=1, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), sparse=True),
        "matches"),
    "deepseek-terse-config": (_variant("deepseek-terse", transformers.DeepseekV3Config,
                                       dict(_DEEPSEEK, routed_scaling_factor=2.5, n_shared_experts=1), sparse=True),
                              "matches"),
    # gpt-oss YaRN without original_max_position_embeddings: the reference takes max_position_embeddings
    "gpt_oss-yarn-default-context": (_variant("gpt_oss-yarn", transformers.GptOssConfig, dict(
        _TINY, head_dim=8, num_local_experts=2, num_experts_per_tok=2, sliding_window=6, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0}),
        {"rope_parameters": None, "rope_theta": 100.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
        "matches"),
    # A group of one routed expert: group scoring sums each group's two best (prepared, it failed at serving)
    "deepseek-one-expert-groups": (_variant("deepseek-groups", transformers.DeepseekV3Config,
                                            dict(_DEEPSEEK, n_group=4, topk_group=2, num_experts_per_tok=1)),
                                   "n_group 4 leaves fewer than 2"),
    # Sliding windows as each reference resolves them: Qwen3-MoE slides every layer (it slid none),
    # Qwen2 without use_sliding_window and Llama ignore a window and layer_types (they slid)
    "qwen3_moe-sliding-window": (_variant("qwen3_moe-sliding", transformers.Qwen3MoeConfig, dict(
        _TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, use_sliding_window=True,
        sliding_window=6)), "matches"),
    "qwen2-window-without-use-sliding-window": (_variant(
        "qwen2-unswitched", transformers.Qwen2Config, dict(_TINY, use_sliding_window=False),
        {"sliding_window": 6, "layer_types": ["full_attention", "sliding_attention"]}), "matches"),
    "llama-layer-types-ignored": (_variant("llama-unslid", transformers.LlamaConfig, dict(_TINY),
                                           {"sliding_window": 6, "layer_types": ["sliding_attention"] * 2}), "matches"),
    # Both rope layouts in one config.json: transformers reads rope_scaling (rope_parameters was read)
    "llama-rope-scaling-beside-rope-parameters": (_variant(
        "llama-both", transformers.LlamaConfig,
        dict(_TINY, rope_parameters={"rope_type": "linear", "rope_theta": 100.0, "factor": 4.0}),
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "rope_theta": 100.0,
         "rope_scaling": {"type": "linear", "factor": 4.0}}), "matches"),
    # More experts per token than the kept groups hold: the choice falls on dropped groups (accepted before)
    "glm4_moe-top-k-past-kept-groups": (_variant("glm4_moe-top-k", transformers.Glm4MoeConfig, dict(
        _GLM, n_routed_experts=8, n_group=4, topk_group=1, num_experts_per_tok=3, n_shared_experts=1)),
        "num_experts_per_tok 3 exceeds the 2 experts"),
    # Bamba's rotary settings in the legacy layout (top-level partial_rotary_factor) were not read
    # BambaConfig sets a top-level partial_rotary_factor to 0.5 whatever config.json says (only the rope
    # dict's own counts): a legacy config.json's 1.0 there was read, a different model from transformers'
    "bamba-legacy-partial-rotary": (_variant("bamba-legacy", transformers.BambaConfig, dict(
        _TINY, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}),
        {"rope_parameters": None, "rope_theta": 100.0, "partial_rotary_factor": 1.0}), "matches"),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_variant(tmp_path, name):
    variant, expected = PINNED[name]
    outcome = check_variant(variant, tmp_path)
    assert outcome == expected if expected == "matches" else expected in outcome


def test_a_vision_language_checkpoint_with_yarn_is_refused_by_name():
    """The mrope tables have no YaRN attention factor: the text decoder's yarn is refused, not dropped."""
    from helios.ignition.recipes import qwen_vl
    from helios.ignition.recipes.base import UnsupportedCheckpoint

    class NoTensors:
        names = frozenset()

        def __contains__(self, name):
            return False

    text = dict(_TINY, rope_scaling={"type": "yarn", "factor": 4.0, "mrope_section": [2, 2, 4]})
    with pytest.raises(UnsupportedCheckpoint, match="rope_type 'yarn'"):
        qwen_vl.build("Qwen2_5_VLForConditionalGeneration", {"text_config": text}, NoTensors(), None)


def test_mixture_groups_need_two_experts_each_and_hold_the_choice():
    from helios.ignition.architecture import MixtureOfExperts

    with pytest.raises(CheckpointError, match="fewer than 2 per group"):
        MixtureOfExperts(4, 1, 16, (0,), scoring="sigmoid", num_groups=4, topk_groups=2)
    with pytest.raises(CheckpointError, match="3 experts per token of the 1 kept groups of 2"):
        MixtureOfExperts(8, 3, 16, (0,), scoring="sigmoid", num_groups=4, topk_groups=1)
