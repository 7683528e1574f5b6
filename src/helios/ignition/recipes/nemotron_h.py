"""Recipe for Nemotron-H checkpoints (NemotronHForCausalLM).

Nemotron-H stacks blocks of four kinds, each a pre-norm, its mixer and a residual add:
"linear_attention" (a Mamba2 mixer), "full_attention" (grouped-query attention without positions
or biases), "mlp" (the non-gated ``down(relu(up(x))^2)``) and "moe". ``layers_block_type`` (or
``layer_types``; the legacy ``hybrid_override_pattern`` string spells them M, *, - and E) lists them.

Helios's hybrid layer is a mixer block followed by an MLP block (`helios.ignition.hybrid_decoder`),
so each Mamba2 or attention block becomes one layer together with the MLP block that follows it;
a mixer block followed by another mixer block (or ending the stack) becomes a layer without an MLP
(`Architecture.mlp_free_layers`). The arithmetic is the reference's: block i's norm is the layer's
``input_norm``, the next block's norm its ``post_norm``. Attention rotates nothing: all-zero rotary
frequencies (cos 1, sin 0). The reference never ties the head to the embeddings.

A "moe" block is a layer's mixture of experts: DeepSeek-V3's sigmoid routing (``gate.weight``, the
``e_score_correction_bias`` choice bias, ``n_group`` / ``topk_group``, ``norm_topk_prob``,
``routed_scaling_factor``), non-gated relu2 experts (``experts.{e}.up_proj`` / ``down_proj``, or
stacked ``experts.up_proj`` / ``down_proj``: `helios::moe_experts` "relu2") and the relu2 shared
expert ``shared_experts`` of ``moe_shared_expert_intermediate_size``; with ``moe_latent_size`` the
routed experts work in that latent (``fc1_latent_proj`` / ``fc2_latent_proj``, `MixtureOfExperts.latent_size`).

Refused by name: an MLP or MoE block that follows no mixer or attention block, a stack without a
Mamba2 or an attention block, other activations and MLP biases beside experts (the shared expert
and the latent projections have no bias slots).
Checkpoint tensors live under ``backbone.`` (the released spelling) or ``model.``; multi-token
prediction tensors (``mtp.``) are not served and skipped, as the reference skips them.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts
from helios.ignition.recipes import bamba, plain_mlp
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recurrent_geometry import RecurrentGeometry

ARCHITECTURES = ("NemotronHForCausalLM",)
MIXER, ATTENTION, MLP, MOE = "linear_attention", "full_attention", "mlp", "moe"
_PATTERN = {"M": MIXER, "*": ATTENTION, "-": MLP, "E": MOE}
_LEGACY = {"mamba": MIXER, "attention": ATTENTION}
# NemotronHConfig's older spellings, which win over the current key where present
_ALIASES = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "time_step_limit": "mamba_dt_limit",
            "use_conv_bias": "mamba_conv_bias"}
_DTYPES = ("float32", "bfloat16", "float16")
_FEED_FORWARD = (MLP, MOE)


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    prefix = "backbone." if "backbone.embeddings.weight" in tensors else "model."
    kinds = block_kinds(config)
    pairs = paired_blocks(kinds)
    arch = architecture_from_config(config, kinds, pairs, tensors, dtype, prefix)
    weights, used = prepared_weights(arch, pairs, tensors, prefix)
    unplaced = sorted(name for name in tensors.names - used if not name.startswith("mtp."))
    if unplaced:
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def block_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each block's kind, as NemotronHConfig resolves them (module docstring)."""
    kinds = config.get("layers_block_type", config.get("layer_types"))
    if kinds is None and isinstance(config.get("hybrid_override_pattern"), str):
        pattern = config["hybrid_override_pattern"]
        if not set(pattern) <= set(_PATTERN):
            raise UnsupportedCheckpoint(f"config.json: hybrid_override_pattern {pattern!r:.120} must spell each block "
                                        f"as one of {sorted(_PATTERN)}")
        kinds = [_PATTERN[char] for char in pattern]
    if kinds is None:
        kinds = [MIXER, MOE, ATTENTION, MLP]  # the config class's default
    if not isinstance(kinds, list) or not kinds or not all(isinstance(kind, str) for kind in kinds):
        raise UnsupportedCheckpoint(f"config.json: layers_block_type {kinds!r:.120} must list the blocks' kinds")
    kinds = [_LEGACY.get(kind, kind) for kind in kinds]
    if not set(kinds) <= {MIXER, ATTENTION, MLP, MOE}:
        raise UnsupportedCheckpoint(f"config.json: layers_block_type {kinds!r:.120} must name one of "
                                    f"{(MIXER, ATTENTION, MLP, MOE)} per block")
    return tuple(kinds)


def paired_blocks(kinds: tuple[str, ...]) -> tuple[tuple[int, int | None], ...]:
    """(mixer block, MLP / MoE block or None) of each Helios layer: a Mamba2 or attention block and
    the MLP or MoE block right after it."""
    pairs, block = [], 0
    while block < len(kinds):
        if kinds[block] not in (MIXER, ATTENTION):
            raise UnsupportedCheckpoint(f"config.json: layers_block_type's block {block} ({kinds[block]!r}) follows "
                                        f"no Mamba2 or attention block, which is not supported")
        mlp = block + 1 if block + 1 < len(kinds) and kinds[block + 1] in _FEED_FORWARD else None
        pairs.append((block, mlp))
        block += 1 if mlp is None else 2
    mixers = {kinds[first] for first, _ in pairs}
    if mixers != {MIXER, ATTENTION}:
        raise UnsupportedCheckpoint(f"config.json: layers_block_type needs a Mamba2 ({MIXER!r}) and an attention "
                                    f"({ATTENTION!r}) block, got only {sorted(mixers)}")
    return tuple(pairs)


def architecture_from_config(config: Mapping[str, Any], kinds: tuple[str, ...], pairs, tensors: CheckpointTensors,
                             dtype: str | None, prefix: str) -> Architecture:
    for key, expected in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if config.get(key, expected) != expected:
            raise UnsupportedCheckpoint(f"config.json: {key} {config.get(key)!r} is not supported (only {expected!r})")
    declared = config.get("dtype") or config.get("torch_dtype")
    if dtype is None:
        dtype = declared if declared in _DTYPES else str(tensors.get(prefix + "embeddings.weight").dtype).removeprefix(
            "torch.")
    num_heads = int(config["num_attention_heads"])
    mixers = tuple(layer for layer, (first, _) in enumerate(pairs) if kinds[first] == MIXER)
    return Architecture(
        vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]), num_layers=len(pairs), num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads), head_dim=int(config["head_dim"]),
        rms_norm_eps=float(config["layer_norm_epsilon"]), layer_windows=(0,) * len(pairs),
        mlp_bias=bool(config.get("mlp_bias", False)), dtype=dtype, recurrent=_geometry(config, mixers),
        gated_mlp=False, mlp_activation="relu2", moe=_mixture(config, kinds, pairs),
        mlp_free_layers=tuple(layer for layer, (_, mlp) in enumerate(pairs) if mlp is None),
    )


def _mixture(config: Mapping[str, Any], kinds: tuple[str, ...], pairs) -> MixtureOfExperts | None:
    sparse = tuple(layer for layer, (_, block) in enumerate(pairs) if block is not None and kinds[block] == MOE)
    if not sparse:
        return None
    if config.get("mlp_bias"):
        raise UnsupportedCheckpoint("config.json: mlp_bias true beside moe blocks is not supported (the shared "
                                    "expert's and latent projections' biases)")
    return MixtureOfExperts(
        int(config["n_routed_experts"]), int(config["num_experts_per_tok"]), int(config["moe_intermediate_size"]),
        sparse, scoring="sigmoid", num_groups=int(config["n_group"]), topk_groups=int(config["topk_group"]),
        normalize=bool(config["norm_topk_prob"]), scale=float(config["routed_scaling_factor"]),
        correction_bias=True, activation="relu2", latent_size=int(config.get("moe_latent_size") or 0),
        # NemotronHMLP's width: intermediate_size where the shared width is 0 or null
        shared_intermediate_size=int(config["moe_shared_expert_intermediate_size"] or config["intermediate_size"]))


def _setting(config: Mapping[str, Any], key: str) -> Any:
    alias = _ALIASES.get(key)
    return config[alias] if alias in config else config[key]


def _geometry(config: Mapping[str, Any], layers: tuple[int, ...]) -> RecurrentGeometry:
    limit = _setting(config, "time_step_limit") or (0.0, float("inf"))
    use_bias = bool(config.get("use_bias", False))
    return RecurrentGeometry(
        layers=layers, num_heads=int(config["mamba_num_heads"]), head_dim=int(config["mamba_head_dim"]),
        state_size=int(config["ssm_state_size"]), num_groups=int(_setting(config, "n_groups")),
        conv_kernel=int(_setting(config, "conv_kernel")), proj_bias=use_bias, out_bias=use_bias,
        dt_limit=(bamba.config_float(limit[0]), bamba.config_float(limit[1])),
    )


def prepared_weights(arch: Architecture, pairs, tensors: CheckpointTensors, prefix: str):
    """The weights in program layout, and the checkpoint names they were made from."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    weights = [NamedWeight("embed", take(prefix + "embeddings.weight"))]
    for layer, (first, mlp) in enumerate(pairs):
        weights += _layer_weights(arch, layer, f"{prefix}layers.{first}.", take, tensors, used)
        if mlp is not None and arch.is_sparse(layer):
            weights += _moe_weights(arch, layer, f"{prefix}layers.{mlp}.", take, tensors)
        elif mlp is not None:
            weights += _mlp_weights(arch, layer, f"{prefix}layers.{mlp}.", take, tensors)
    weights += [NamedWeight("final_norm", take(prefix + "norm_f.weight")),
                NamedWeight("lm_head", take("lm_head.weight")),
                NamedWeight("rope.inv_freq", torch.zeros(arch.head_dim // 2))]
    return tuple(weights), used


def _layer_weights(arch: Architecture, layer: int, src: str, take, tensors, used: set) -> list[NamedWeight]:
    dst = f"layers.{layer}."
    out = [NamedWeight(dst + "input_norm", take(src + "norm.weight"))]
    if layer in arch.recurrent.layers:
        return out + bamba.mixer_weights(arch, src + "mixer.", dst + "mixer.", take, tensors, used)
    return out + bamba.attention_weights(arch, src + "mixer.", dst, take)


def _mlp_weights(arch: Architecture, layer: int, src: str, take, tensors: CheckpointTensors) -> list[NamedWeight]:
    post_norm = NamedWeight(f"layers.{layer}.post_norm", take(src + "norm.weight"))
    return [post_norm, *plain_mlp.mlp_weights(arch, layer, take, tensors, src=src + "mixer.")]


def _moe_weights(arch: Architecture, layer: int, src: str, take, tensors: CheckpointTensors) -> list[NamedWeight]:
    dst, moe = f"layers.{layer}.", src + "mixer."

    def experts(projection: str) -> torch.Tensor:
        if moe + f"experts.{projection}" in tensors:  # transformers' in-memory stacked spelling
            return take(moe + f"experts.{projection}")
        names = [moe + f"experts.{expert}.{projection}.weight" for expert in range(arch.moe.num_experts)]
        return fused(take, names, stack=True)

    out = [NamedWeight(dst + "post_norm", take(src + "norm.weight")),
           NamedWeight(dst + "router.weight", take(moe + "gate.weight").float()),
           NamedWeight(dst + "router.correction_bias", take(moe + "gate.e_score_correction_bias").float())]
    if arch.moe.latent_size:
        out.append(NamedWeight(dst + "latent_in.weight", take(moe + "fc1_latent_proj.weight")))
    out += [NamedWeight(dst + "experts.up", experts("up_proj").contiguous()),
            NamedWeight(dst + "experts.down", experts("down_proj").contiguous())]
    if arch.moe.latent_size:
        out.append(NamedWeight(dst + "latent_out.weight", take(moe + "fc2_latent_proj.weight")))
    if arch.moe.shared_intermediate_size:
        out += [NamedWeight(dst + "shared.up.weight", take(moe + "shared_experts.up_proj.weight")),
                NamedWeight(dst + "shared.down.weight", take(moe + "shared_experts.down_proj.weight"))]
    return out
