"""Recipe for the Llama family of Hugging Face checkpoints.

Covers LlamaForCausalLM (Llama 2 and 3, rope scaling "default", "linear", "llama3" and "yarn", whose
attention factor scales the rotary cos/sin tables: `Architecture.rotary_factor`),
MistralForCausalLM (sliding window on every layer), Qwen2ForCausalLM / Qwen2.5 (q/k/v bias, optional
sliding layers), Qwen3ForCausalLM (per-head q/k RMS norm), SeedOssForCausalLM (Seed-OSS: q/k/v
bias, an o bias of its own switch) and InternLM3ForCausalLM (InternLM3, which transformers runs as
Llama: ``qkv_bias`` / ``bias`` put biases on the projections the checkpoint holds them for): grouped-query
attention, tied or untied embeddings. All the
family knowledge lives here; it becomes Architecture fields and the prepared weight layout (q/k/v
and gate/up fused, rotary frequencies computed once).

Optional tensors (q/k/v, o and MLP biases, q/k norms) are taken from what the checkpoint holds, so
a Llama checkpoint with ``attention_bias`` and a Qwen2 one with q/k/v bias need no special case.
A checkpoint tensor this recipe does not place is an error: it would be silently ignored otherwise.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint, fused
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.yarn import yarn_attention_factor, yarn_inv_freq

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "SeedOssForCausalLM", "InternLM3ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LAYER_TYPES = ("sliding_attention", "full_attention")  # layer kinds of layer_types
# Rope types whose pretraining context transformers reads from a top-level
# ``original_max_position_embeddings`` before the rope dict's own (Phi-3's spelling), else from
# ``max_position_embeddings``.
_ORIGINAL_CONTEXT_TYPES = ("llama3", "yarn")
# Their references mask causally whatever sliding_window, use_sliding_window and layer_types say (Llama 4's
# locality is its own chunks, `llama4._layer_chunks`).
_NO_WINDOW = ("LlamaForCausalLM", "SeedOssForCausalLM", "Ernie4_5ForCausalLM", "GraniteForCausalLM",
              "HunYuanDenseV1ForCausalLM", "InternLM3ForCausalLM", "Ernie4_5_MoeForCausalLM", "GraniteMoeForCausalLM",
              "GraniteMoeSharedForCausalLM", "MiniMaxM2ForCausalLM", "OlmoeForCausalLM", "Glm4MoeForCausalLM",
              "HunYuanMoEV1ForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration")
_EVERY_LAYER_WINDOW = ("MistralForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")
_WINDOW_SWITCHED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")  # use_sliding_window
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Whether the reference's q/k/v, o and dense-MLP projections have biases, by layer 0's tensor: a
# config.json switch (read with the config class's default) or a constant. transformers builds the modules
# by these alone and drops bias tensors it has no module for, so a checkpoint holding one is refused
# (`check_declared_biases`), not served with it. Families not listed (other tensor names, their own
# checks) are not checked here.
_Q, _O, _GATE, _UP = "self_attn.q_proj.bias", "self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias"
_ATTENTION_BIAS = ("attention_bias", False)
_NO_BIASES = {_Q: False, _O: False, _GATE: False, _UP: False}
_ATTENTION_BIASES = {_Q: _ATTENTION_BIAS, _O: _ATTENTION_BIAS, _GATE: False, _UP: False}
_ALL_BIASES = {_Q: _ATTENTION_BIAS, _O: _ATTENTION_BIAS, _GATE: ("mlp_bias", False), _UP: ("mlp_bias", False)}
_BIAS_SWITCHES: dict[str, dict[str, tuple[str, bool] | bool]] = {
    **dict.fromkeys(("LlamaForCausalLM", "GraniteForCausalLM", "GraniteSWAForCausalLM", "SmolLM3ForCausalLM"),
                    _ALL_BIASES),
    **dict.fromkeys(("ArceeForCausalLM", "NemotronForCausalLM"), {_Q: _ATTENTION_BIAS, _O: _ATTENTION_BIAS,
                                                                 _UP: ("mlp_bias", False)}),  # no gate_proj
    **dict.fromkeys(("MistralForCausalLM", "MixtralForCausalLM", "MinistralForCausalLM", "Ministral3ForCausalLM",
                     "MiniMaxM2ForCausalLM", "Exaone4ForCausalLM", "ExaoneMoeForCausalLM"), _NO_BIASES),
    **dict.fromkeys(("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM",
                     "OlmoForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM",
                     "FlexOlmoForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "VaultGemmaForCausalLM",
                     "Gemma3ForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM", "AfmoeForCausalLM",
                     "ApertusForCausalLM",
                     "Dots1ForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
                     "GraniteMoeSWAForCausalLM", "NanoChatForCausalLM"), _ATTENTION_BIASES),
    "Qwen2ForCausalLM": {**_NO_BIASES, _Q: True},
    "SeedOssForCausalLM": {_Q: ("attention_bias", True), _O: ("attention_out_bias", False), _GATE: ("mlp_bias", False)},
    **dict.fromkeys(("Glm4MoeForCausalLM", "SolarOpenForCausalLM"), {**_NO_BIASES, _Q: _ATTENTION_BIAS}),
    **dict.fromkeys(("Glm4ForCausalLM", "GlmForCausalLM"), {**_NO_BIASES, _Q: ("attention_bias", True)}),
    "HeliumForCausalLM": {**_ALL_BIASES, _O: False},
    "CwmForCausalLM": {**_ALL_BIASES, _Q: False, _O: False},
    "Jais2ForCausalLM": {_Q: ("attention_bias", True), _O: ("attention_bias", True), _UP: ("mlp_bias", True)},
    "Ernie4_5ForCausalLM": {_Q: ("use_bias", False), _O: ("use_bias", False), _GATE: ("use_bias", False)},
    "Ernie4_5_MoeForCausalLM": {_Q: ("use_bias", False), _O: ("use_bias", False)},  # layer 0 may be sparse
    "StableLmForCausalLM": {**_NO_BIASES, _Q: ("use_qkv_bias", False)},
    **dict.fromkeys(("PhimoeForCausalLM", "Llama4ForCausalLM"), {_Q: _ATTENTION_BIAS, _O: _ATTENTION_BIAS}),
    "GptOssForCausalLM": {_Q: ("attention_bias", True), _O: ("attention_bias", True)},
    "Starcoder2ForCausalLM": {_Q: ("use_bias", True), _O: ("use_bias", True), "mlp.c_fc.bias": ("use_bias", True)},
    "GPTNeoXForCausalLM": {"attention.query_key_value.bias": ("attention_bias", True),
                           "attention.dense.bias": ("attention_bias", True)},
}
_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(source, config, tensors, dtype)
    weights, used = prepared_weights(arch, config, tensors)
    return placed_recipe(source, arch, weights, used, tensors)


def placed_recipe(source: str, arch: Architecture, weights, used: set[str], tensors: CheckpointTensors,
                  ignored: Callable[[str], bool] | None = None) -> Recipe:
    """The recipe of `weights` (made from the checkpoint tensors `used`); an UnsupportedCheckpoint
    where the checkpoint holds a tensor they leave out (a tied model's own lm_head, rotary buffers and
    the names `ignored` accepts aside)."""
    unplaced = sorted(name for name in tensors.names - used
                      if not name.endswith(_IGNORED_SUFFIXES) and not (ignored and ignored(name)))
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights)


def architecture_from_config(source, config, tensors: CheckpointTensors, dtype: str | None) -> Architecture:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    num_heads = int(config["num_attention_heads"])
    num_layers = int(config["num_hidden_layers"])
    prefix = "model.layers.0."
    check_declared_biases(source, config, tensors)
    return Architecture(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        layer_windows=layer_windows(source, config, num_layers),
        qkv_bias=prefix + "self_attn.q_proj.bias" in tensors,
        o_bias=prefix + "self_attn.o_proj.bias" in tensors,
        mlp_bias=prefix + "mlp.gate_proj.bias" in tensors,
        qk_norm=prefix + "self_attn.q_norm.weight" in tensors,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or _checkpoint_dtype(config, tensors),
        rotary_factor=rope_attention_factor(config),
    )


def check_declared_biases(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                          layer: str = "model.layers.0.") -> None:
    """An UnsupportedCheckpoint naming the setting where the checkpoint holds a q/k/v, o or MLP bias that
    the `source` reference has no module for: it drops the tensor, and the biases are otherwise read from
    the tensors held (`architecture_from_config`). (A bias it builds but the checkpoint lacks it fills with
    zeros, which is no bias: served as it is.) `layer` is the first layer's tensor prefix."""
    for suffix, switch in _BIAS_SWITCHES.get(source, {}).items():
        if layer + suffix in tensors and not (switch if isinstance(switch, bool) else config.get(*switch)):
            setting = f"{source} has no {suffix}" if isinstance(switch, bool) else f"config.json: {switch[0]} false"
            raise UnsupportedCheckpoint(f"{setting}, but the checkpoint holds {suffix} tensors (the reference drops "
                                        f"them)")


def layer_windows(source: str, config: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Per-layer sliding window (0 = full attention), as the Hugging Face reference resolves it: Llama,
    Seed-OSS, Ernie 4.5 (dense and MoE), Granite (and Granite MoE), Hunyuan (dense and MoE), InternLM3, OLMoE,
    MiniMax-M2, GLM-4.5 and Llama 4 have none; Mistral, Mixtral and Qwen3-MoE slide every layer over
    ``sliding_window`` (their references read no ``layer_types``); the Qwen families' window applies only
    with ``use_sliding_window`` (their references drop it otherwise, and a sliding layer without a window
    attends fully); the others follow ``layer_types``, or slide from ``max_window_layers`` on."""
    if source in _NO_WINDOW:  # before reading sliding_window: these references never read it
        return (0,) * num_layers
    window = int(config.get("sliding_window") or 0)
    if source in _WINDOW_SWITCHED and not config.get("use_sliding_window"):
        window = 0
    if source in _EVERY_LAYER_WINDOW:
        return (window,) * num_layers
    layer_types = config.get("layer_types")
    if layer_types is None and config.get("use_sliding_window"):
        first = int(config.get("max_window_layers", num_layers))
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if layer_types is None:
        return (0,) * num_layers
    if len(layer_types) != num_layers or not set(layer_types) <= {"sliding_attention", "full_attention"}:
        raise UnsupportedCheckpoint(f"layer_types {layer_types} are not full/sliding attention per layer")
    if "sliding_attention" in layer_types and window <= 0 and source not in _WINDOW_SWITCHED:
        raise UnsupportedCheckpoint("sliding_attention layers need a positive sliding_window")
    return tuple(window if kind == "sliding_attention" else 0 for kind in layer_types)


def listed_layer_types(kinds, num_layers: int) -> tuple[str, ...]:
    """A config's own ``layer_types`` (families that default them otherwise: Gemma 2 and 3, Cohere 2,
    OLMo 3), checked: a list naming one of `LAYER_TYPES` for each layer."""
    if not isinstance(kinds, list) or len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise UnsupportedCheckpoint(f"config.json: layer_types {kinds!r:.120} must name one of {LAYER_TYPES} for "
                                    f"each of the {num_layers} layers")
    return tuple(kinds)


def sliding_layer_windows(config: Mapping[str, Any], kinds: tuple[str, ...]) -> tuple[int, ...]:
    """Each layer's window for the layer `kinds`: ``sliding_window`` (a positive count wherever a
    layer slides) for the sliding_attention layers, 0 for the others."""
    window = config.get("sliding_window")
    if "sliding_attention" in kinds and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UnsupportedCheckpoint(f"config.json: sliding_window {window!r} must be a positive count for the "
                                    f"sliding_attention layers")
    return tuple(window if kind == "sliding_attention" else 0 for kind in kinds)


def mlp_activation(config: Mapping[str, Any], activations: Mapping[str, str]) -> str:
    """The `Architecture.mlp_activation` that `activations` maps the config's ``hidden_act`` to (a
    non-gated MLP family's: Phi, StarCoder2); an UnsupportedCheckpoint naming those taken otherwise."""
    activation = config.get("hidden_act")
    if activation not in activations:
        raise UnsupportedCheckpoint(f"config.json: hidden_act {activation!r} is not supported (only "
                                    f"{sorted(activations)})")
    return activations[activation]


def norm_epsilon(config: Mapping[str, Any], key: str):
    """The config's LayerNorm epsilon under `key`, as it stands; an UnsupportedCheckpoint unless it
    is a finite number >= 0."""
    eps = config.get(key)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise UnsupportedCheckpoint(f"config.json: {key} must be a finite number >= 0, got {eps!r}")
    return eps


def rope_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the rope dict transformers reads: a legacy ``rope_scaling`` before ``rope_parameters``
    (a config holding both is read from ``rope_scaling``), or an empty one."""
    return dict(config.get("rope_scaling") or config.get("rope_parameters") or {})


def layer_kind_rope(config: Mapping[str, Any], full_theta, sliding_theta) -> tuple[dict[str, Any], dict[str, Any]]:
    """The unchecked rope settings of the full layers, then of the sliding layers, of a family that
    rotates its two layer kinds with their own tables (Gemma 3, OLMo 3): ``rope_parameters`` keyed by
    layer kind, or the legacy top-level spelling, whose ``rope_scaling`` applies to the full layers;
    a table without ``rope_theta`` takes `full_theta` / `sliding_theta`."""
    params = config.get("rope_parameters")
    if params is not None and (not isinstance(params, dict) or not set(params) <= set(LAYER_TYPES)):
        raise UnsupportedCheckpoint(f"config.json: rope_parameters {params!r:.120} must map {LAYER_TYPES} to "
                                    f"rope settings")
    params = params or {}
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    full.update(config.get("rope_scaling") or {})
    full.setdefault("rope_theta", full_theta)
    sliding = dict(params.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", sliding_theta)
    return full, sliding


def rope_parameters(config: Mapping[str, Any], partial: bool = False) -> dict[str, Any]:
    """The rope settings in the current layout, from either `rope_parameters` or `rope_theta`/`rope_scaling`.
    A partial rotary factor is an error unless the family supports it (`partial`)."""
    params = rope_settings(config)
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] not in ROPE_TYPES:
        raise UnsupportedCheckpoint(f"rope_type {params['rope_type']!r} is not one of {ROPE_TYPES}")
    params["partial_rotary_factor"] = rotary_fraction(params, config, partial)
    return checked_rope(with_original_context(params, config))


def rotary_fraction(params: Mapping[str, Any], config: Mapping[str, Any], partial: bool) -> float:
    """The partial rotary factor, the rope dict's before config.json's top-level one; other than 1 an
    error unless the family rotates part of each head (`partial`): the reference's scaled ropes
    would compute frequencies for part of a head its attention rotates whole."""
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor") or 1.0)
    if factor is None:
        raise UnsupportedCheckpoint("config.json: partial_rotary_factor must be a number, got null")
    if float(factor) != 1.0 and not partial:
        raise UnsupportedCheckpoint(f"partial_rotary_factor {float(factor)} is not supported "
                                    f"(this family rotates whole heads)")
    return float(factor)


# The keys transformers requires of a rope type (its _validate_<type>_rope_parameters refuses a
# config.json without one; rope_theta and original_max_position_embeddings it fills in).
_REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ("factor",)}
_LARGEST_ATTENTION_FACTOR = math.sqrt(torch.finfo(torch.float32).max)  # its square is q.k's factor


def checked_rope(params: dict[str, Any]) -> dict[str, Any]:
    """`params` (type and original context resolved) if the reference computes finite rotary
    frequencies from them; otherwise an UnsupportedCheckpoint naming the config.json key: a key the
    reference requires, a null it would compute with (theta, a llama3/yarn original context), a
    divisor of zero (llama3's frequency factors; YaRN's log of theta, of the original context and of
    the correction betas, whose null or 0 means their defaults 32 and 1), an attention factor whose
    square overflows float32. (A null YaRN factor is the reference's too: max / original context.)"""
    kind = params["rope_type"]
    for key in _REQUIRED.get(kind, ()):
        if key not in params:
            raise UnsupportedCheckpoint(f"config.json: rope_type {kind!r} has no {key!r}, which the reference requires")
    if params.get("rope_theta") is None:
        raise UnsupportedCheckpoint("config.json: rope_theta must be a positive number, got null")
    nonzero = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(kind, ())
    for key in nonzero:
        if not params[key]:
            raise UnsupportedCheckpoint(f"rope_type {kind!r} needs a non-zero {key}, got {params[key]!r}")
    attention_factor = params.get("attention_factor")
    if attention_factor is not None and abs(attention_factor) > _LARGEST_ATTENTION_FACTOR:
        raise UnsupportedCheckpoint(f"attention_factor {attention_factor} overflows every attention logit "
                                    f"(it multiplies both queries and keys)")
    if kind in _ORIGINAL_CONTEXT_TYPES and params.get("original_max_position_embeddings") is None:
        raise UnsupportedCheckpoint(f"rope_type {kind!r} needs original_max_position_embeddings (or "
                                    f"max_position_embeddings), got null")
    if kind == "yarn":
        if float(params["rope_theta"]) == 1.0:
            raise UnsupportedCheckpoint("rope_type 'yarn' needs a rope_theta other than 1 (its log divides)")
        betas = {"beta_fast": params.get("beta_fast") or 32, "beta_slow": params.get("beta_slow") or 1,
                 "original_max_position_embeddings": params.get("original_max_position_embeddings") or 0}
        for key, value in betas.items():
            if not value > 0:
                raise UnsupportedCheckpoint(f"rope_type 'yarn' needs a positive {key}, got {params.get(key)!r}")
    return params


def with_original_context(params: dict[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with the pretraining context transformers gives a "llama3" or "yarn" rope: a top-level
    ``original_max_position_embeddings`` (Phi-3's spelling) before the rope dict's own, else
    ``max_position_embeddings``."""
    if params.get("rope_type") in _ORIGINAL_CONTEXT_TYPES:
        if "original_max_position_embeddings" in config:  # even null: the reference reads it, and refuses null
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        elif "original_max_position_embeddings" not in params:
            params["original_max_position_embeddings"] = config.get("max_position_embeddings")
    return params


def rope_attention_factor(config: Mapping[str, Any]) -> float:
    """The factor on the rotary cos/sin tables: YaRN's attention factor, 1.0 for every other rope type."""
    params = rope_parameters(config, partial=True)
    if params["rope_type"] != "yarn":
        return 1.0
    return yarn_attention_factor(params, config.get("max_position_embeddings"))


def rotary_width(config: Mapping[str, Any], head_dim: int) -> int:
    """The rotated leading dimensions of a head: head_dim times the partial rotary factor."""
    factor = rope_parameters(config, partial=True)["partial_rotary_factor"]
    width = int(head_dim * factor)
    if width <= 0 or width % 2 or width > head_dim:
        raise UnsupportedCheckpoint(f"partial_rotary_factor {factor} gives a rotary width of {width} of head_dim "
                                    f"{head_dim}, not a positive even width within the head")
    return width


def rope_inv_freq(config: Mapping[str, Any], head_dim: int, partial: bool = False) -> torch.Tensor:
    """float32 rotary inverse frequencies [head_dim / 2], scaling applied (the reference's arithmetic);
    head_dim is the rotated width where only part of a head rotates."""
    params = rope_parameters(config, partial)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (params["rope_theta"] ** exponents)
    if params["rope_type"] == "linear":
        return inv_freq / params["factor"]
    if params["rope_type"] == "llama3":
        return _llama3_scaled(inv_freq, params)
    if params["rope_type"] == "yarn":
        return yarn_inv_freq(params, head_dim, config.get("max_position_embeddings"))[0]
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def prepared_weights(arch: Architecture, config, tensors: CheckpointTensors, layer_weights=None, inv_freq=None,
                     transform=None):
    """The weights in program layout, and the checkpoint names they were made from. `layer_weights`
    (arch, layer, take) -> slots of one layer (default: attention and the dense MLP); `inv_freq`
    replaces the rotary frequencies; `transform` (name, tensor) -> tensor rewrites checkpoint tensors."""
    layer_weights = layer_weights or _layer_weights
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        tensor = tensors.get(name).to(arch.torch_dtype)
        return transform(name, tensor) if transform else tensor

    weights = [NamedWeight("embed", take("model.embed_tokens.weight"))]
    for layer in range(arch.num_layers):
        weights += layer_weights(arch, layer, take)
    weights.append(NamedWeight("final_norm", take("model.norm.weight")))
    if not arch.tie_word_embeddings:
        weights.append(NamedWeight("lm_head", take("lm_head.weight")))
    inv_freq = rope_inv_freq(config, arch.head_dim) if inv_freq is None else inv_freq
    weights.append(NamedWeight("rope.inv_freq", inv_freq))
    return tuple(weights), used


def _layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    return attention_weights(arch, layer, take) + dense_mlp_weights(arch, layer, take)


def attention_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A layer's slots from ``input_norm`` through ``post_norm`` (attention and its norms)."""
    out = attention_block_weights(arch, layer, take)
    post_norm = take(f"model.layers.{layer}.post_attention_layernorm.weight")
    return out + [NamedWeight(f"layers.{layer}.post_norm", post_norm)]


def attention_block_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A layer's slots from ``input_norm`` through ``o`` (the attention and its input norm; a
    parallel block, Cohere's, has no post norm)."""
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    attn = src + "self_attn."
    qkv = [attn + "q_proj.", attn + "k_proj.", attn + "v_proj."]
    out = [NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
           NamedWeight(dst + "qkv.weight", fused(take, [p + "weight" for p in qkv]))]
    if arch.qkv_bias:
        out.append(NamedWeight(dst + "qkv.bias", fused(take, [p + "bias" for p in qkv])))
    if arch.qk_norm:
        out += [NamedWeight(dst + "q_norm", take(attn + "q_norm.weight")),
                NamedWeight(dst + "k_norm", take(attn + "k_norm.weight"))]
    out.append(NamedWeight(dst + "o.weight", take(attn + "o_proj.weight")))
    if arch.o_bias:
        out.append(NamedWeight(dst + "o.bias", take(attn + "o_proj.bias")))
    return out


def dense_mlp_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
    """A layer's gated MLP slots (``gate_up`` fused: gate rows, then up rows)."""
    dst, mlp = f"layers.{layer}.", f"model.layers.{layer}.mlp."
    gate_up = [mlp + "gate_proj.", mlp + "up_proj."]
    out = [NamedWeight(dst + "gate_up.weight", fused(take, [p + "weight" for p in gate_up]))]
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "gate_up.bias", fused(take, [p + "bias" for p in gate_up])))
    out.append(NamedWeight(dst + "down.weight", take(mlp + "down_proj.weight")))
    if arch.mlp_bias:
        out.append(NamedWeight(dst + "down.bias", take(mlp + "down_proj.bias")))
    return out


def _checkpoint_dtype(config: Mapping[str, Any], tensors: CheckpointTensors,
                      embedding: str = "model.embed_tokens.weight") -> str:
    """The config's declared dtype, else the dtype of the checkpoint's `embedding` tensor."""
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared in _DTYPE_NAMES:
        return _DTYPE_NAMES[declared]
    return str(tensors.get(embedding).dtype).removeprefix("torch.")
