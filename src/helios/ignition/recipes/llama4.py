"""Recipe for Llama 4 text decoders (Llama4ForCausalLM: Llama 4 Scout / Maverick's language model).

Llama's attention and norms (`helios.ignition.recipes.llama`), read as Llama4TextConfig and
Llama4TextModel read them, with what Llama 4 adds:

- RoPE and NoPE layers: ``no_rope_layers`` holds a flag per layer (1: the layer rotates, 0: NoPE;
  default: every ``no_rope_layer_interval``-th layer is NoPE, as SmolLM3's, `smollm3.rotary_layers`).
  The reference rotates interleaved pairs (complex rope): each q/k head's rows are de-interleaved
  (`ernie4_5.deinterleaved`), which leaves every q.k unchanged.
- ``use_qk_norm``: the RoPE layers' rotated queries and keys are L2-normed per head (a weightless RMS
  norm of epsilon ``rms_norm_eps``): q/k norms after the rotation whose weights are ones, none on the
  NoPE layers (`Architecture.qk_unnormed_layers`).
- ``attn_temperature_tuning``: the NoPE layers' queries at position p are scaled by
  log1p(floor((p + 1) / ``floor_scale``)) * ``attn_scale`` + 1 (`Architecture.query_temperature`).
- Chunked local attention: the ``chunked_attention`` layers of ``layer_types`` (default: the RoPE
  layers when ``attention_chunk_size`` is set) see only their own chunk of ``attention_chunk_size``
  positions (`Architecture.layer_chunks`, ``helios::paged_attention_chunked``: CPU only for now).
- Mixture-of-experts layers ``moe_layers`` (default: every ``interleave_moe_layer_step``-th layer),
  the others a dense MLP of width ``intermediate_size_mlp``: a float32 router whose top
  ``num_experts_per_tok`` logits are weighted by their sigmoid (not renormalised), each weight scaling
  its expert's input (`MixtureOfExperts.input_weighted`), experts of width ``intermediate_size``
  stored as ``experts.gate_up_proj`` [E, H, 2F] / ``down_proj`` [E, F, H] (transposed here), and a
  shared expert of the same width always added.

Keys config.json leaves out take Llama4TextConfig's defaults. Llama4ForConditionalGeneration (the
multimodal checkpoint, as released) prepares its text decoder alone: ``text_config`` and the
``language_model.*`` tensors, the vision tower (``vision_model.*``, ``multi_modal_projector.*``) left out
with a notice: the core is a text model and takes no images.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from helios.ignition.architecture import Architecture, MixtureOfExperts, QueryTemperature
from helios.ignition.recipes import ernie4_5, llama, smollm3
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors

ARCHITECTURES = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
LAYER_TYPES = ("full_attention", "chunked_attention")
# Llama4TextConfig's defaults for the keys this recipe reads beyond Llama's.
_DEFAULTS = {"intermediate_size": 8192, "intermediate_size_mlp": 16384, "rms_norm_eps": 1e-5, "head_dim": 128,
             "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
             "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
             "floor_scale": 8192, "attn_scale": 0.1, "rope_theta": 500000.0}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    notices: tuple[str, ...] = ()
    if source == "Llama4ForConditionalGeneration":
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise UnsupportedCheckpoint(f"config.json: a {source} checkpoint needs a text_config, got {text!r:.80}")
        skipped = len(tensors.names) - len(_LanguageModel(tensors).names)
        config, tensors = text, _LanguageModel(tensors)
        notices = (f"{source}: the text decoder alone is prepared ({skipped} vision tower tensors are not "
                   f"served); the core takes no images",)
    config = {**_DEFAULTS, **config}
    num_layers = int(config["num_hidden_layers"])
    rotary = smollm3.rotary_layers(config, num_layers)
    nope = tuple(layer for layer, rotates in enumerate(rotary) if not rotates)
    sparse = _moe_layers(config, num_layers)
    base = llama.architecture_from_config(source, {**config, "layer_types": None}, tensors, dtype)
    width = int(config["intermediate_size"])
    experts = MixtureOfExperts(int(config["num_local_experts"]), int(config["num_experts_per_tok"]), width, sparse,
                               scoring="sigmoid", normalize=False, shared_intermediate_size=width,
                               input_weighted=True)
    normed = _flag(config, "use_qk_norm") and len(nope) < num_layers  # (the RoPE layers' norms)
    arch = dataclasses.replace(
        base, moe=experts, intermediate_size=int(config["intermediate_size_mlp"]) if len(sparse) < num_layers else 0,
        nope_layers=nope, qk_norm=normed, qk_norm_after_rotary=normed, qk_unnormed_layers=nope if normed else (),
        layer_chunks=_layer_chunks(config, rotary), query_temperature=_temperature(config, nope))
    llama.rope_parameters(config)  # refuses a partial_rotary_factor: the reference rotates whole heads
    halves = ernie4_5.deinterleaved(arch.head_dim)

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return _attention_weights(arch, layer, take) + _mlp_weights(arch, layer, take)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, transform=halves)
    return dataclasses.replace(llama.placed_recipe(source, arch, weights, used, tensors), notices=notices)


class _LanguageModel:
    """A multimodal checkpoint's ``language_model.*`` tensors under the text checkpoint's names (the
    vision tower's are not among its names)."""

    PREFIX = "language_model."

    def __init__(self, tensors: CheckpointTensors):
        self._tensors = tensors

    def __contains__(self, name: str) -> bool:
        return self.PREFIX + name in self._tensors

    def get(self, name: str) -> torch.Tensor:
        return self._tensors.get(self.PREFIX + name)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name.removeprefix(self.PREFIX) for name in self._tensors.names if name.startswith(self.PREFIX))


def _flag(config: Mapping[str, Any], key: str) -> bool:
    value = config[key]
    if not isinstance(value, bool):
        raise UnsupportedCheckpoint(f"config.json: {key} must be true or false, got {value!r}")
    return value


def _moe_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The sparse layers: ``moe_layers``, or every ``interleave_moe_layer_step``-th layer."""
    layers = config.get("moe_layers")
    if layers is None:
        step = config["interleave_moe_layer_step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise UnsupportedCheckpoint(f"config.json: interleave_moe_layer_step must be a positive integer, "
                                        f"got {step!r}")
        return tuple(range(step - 1, num_layers, step))
    if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
                                               for i in layers):
        raise UnsupportedCheckpoint(f"config.json: moe_layers {layers!r:.80} must list layers of {num_layers}")
    return tuple(sorted(set(layers)))


def _layer_chunks(config: Mapping[str, Any], rotary: tuple[bool, ...]) -> tuple[int, ...]:
    """Each layer's chunk: ``attention_chunk_size`` for the chunked_attention layers, 0 for the others."""
    chunk, kinds = config.get("attention_chunk_size"), config.get("layer_types")
    if kinds is None:
        kinds = ["chunked_attention" if rotates and chunk is not None else "full_attention" for rotates in rotary]
    if not isinstance(kinds, list) or len(kinds) != len(rotary) or not set(kinds) <= set(LAYER_TYPES):
        raise UnsupportedCheckpoint(f"config.json: layer_types {kinds!r:.120} must name one of {LAYER_TYPES} for "
                                    f"each of the {len(rotary)} layers")
    if "chunked_attention" in kinds and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise UnsupportedCheckpoint(f"config.json: attention_chunk_size {chunk!r} must be a positive count for the "
                                    f"chunked_attention layers")
    return tuple(chunk if kind == "chunked_attention" else 0 for kind in kinds)


def _temperature(config: Mapping[str, Any], nope: tuple[int, ...]) -> QueryTemperature | None:
    """The NoPE layers' attention temperature tuning, where ``attn_temperature_tuning`` is on."""
    if not _flag(config, "attn_temperature_tuning") or not nope:
        return None
    floor, scale = config["floor_scale"], config["attn_scale"]
    for key, value in (("floor_scale", floor), ("attn_scale", scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnsupportedCheckpoint(f"config.json: {key} must be a number, got {value!r}")
    if not floor > 0:
        raise UnsupportedCheckpoint(f"config.json: floor_scale {floor!r} must be positive (it divides positions)")
    return QueryTemperature(float(floor), float(scale), nope)


def _attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """Llama's attention slots with ones as the q/k norm weights of the normed layers (the
    reference's L2 norm has no weight)."""
    plain = dataclasses.replace(arch, qk_norm=False, qk_norm_after_rotary=False, qk_unnormed_layers=())
    slots = llama.attention_weights(plain, layer, take)
    if not arch.is_qk_normed(layer):
        return slots
    ones = torch.ones(arch.head_dim, dtype=arch.torch_dtype)
    at = next(i for i, slot in enumerate(slots) if slot.name.endswith(".o.weight"))
    dst = f"layers.{layer}."
    return slots[:at] + [NamedWeight(dst + "q_norm", ones), NamedWeight(dst + "k_norm", ones.clone())] + slots[at:]


def _mlp_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A dense layer's ``feed_forward`` MLP, or a sparse layer's router, experts and shared expert."""
    src, dst = f"model.layers.{layer}.feed_forward.", f"layers.{layer}."
    mlp = src + ("shared_expert." if arch.is_sparse(layer) else "")
    gate_up = NamedWeight(dst + ("shared.gate_up.weight" if arch.is_sparse(layer) else "gate_up.weight"),
                          fused(take, [mlp + "gate_proj.weight", mlp + "up_proj.weight"]))
    down = NamedWeight(dst + ("shared.down.weight" if arch.is_sparse(layer) else "down.weight"),
                       take(mlp + "down_proj.weight"))
    if not arch.is_sparse(layer):
        return [gate_up, down]
    return [NamedWeight(dst + "router.weight", take(src + "router.weight").float()),
            NamedWeight(dst + "experts.gate_up", take(src + "experts.gate_up_proj").transpose(1, 2).contiguous()),
            NamedWeight(dst + "experts.down", take(src + "experts.down_proj").transpose(1, 2).contiguous()),
            gate_up, down]
