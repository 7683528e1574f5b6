"""Recipe for Phi-3 family checkpoints: Phi3ForCausalLM (Phi-3-mini and -medium, Phi-3.5-mini, Phi-4-mini).

The decoder is Llama's (pre-norm RMSNorm, grouped-query attention, SiLU-gated MLP, no biases; the
reference's residual dropouts do nothing at inference), and the checkpoint already holds the fused
tensors the programs take: ``self_attn.qkv_proj`` rows are q, k, v (the prepared ``qkv.weight``)
and ``mlp.gate_up_proj`` rows are gate, then up (the prepared ``gate_up.weight``: the reference
chunks its output in that order and gates with the first half). Also:

- ``partial_rotary_factor`` (Phi-4-mini: 0.75), the rope dict's before the top-level one: the q/k
  rows of each head are reordered (`moe.rotary_order`) so that the decoder's whole-head rotary, with
  zero frequencies past the rotated pairs, is the reference's rotation of the leading dims;
- tied or untied embeddings;
- ``sliding_window``: when set, the reference masks every layer to the last ``sliding_window``
  positions (Phi-3-mini-4k: 2047), and so does the prepared core; null is full attention;
- rope type "default" or "longrope" (Phi3Config reads the legacy "su" and "yarn" as "longrope"
  and refuses every other type, and so does this recipe).

LongRoPE. The reference divides each rotated pair's base frequency by ``short_factor[i]`` or
``long_factor[i]`` and multiplies cos and sin by one attention factor for both lists:
``attention_factor`` when given, else sqrt(1 + ln(factor) / ln(original_max_position_embeddings))
where ``factor`` (the rope dict's, else max_position_embeddings / original_max_position_embeddings)
exceeds 1, else 1. ``original_max_position_embeddings`` is read at the top level, as Phi3Config
does (its own field, 4096 when config.json leaves it out, overrides the rope dict's). The reference
picks the list per forward by the longest position in it: the short list while every position is
below ``original_max_position_embeddings``, the long list beyond, so a cached generation that
crosses that length keeps the keys it cached under the short list. A core holds one rotary table,
so the rule here is static, by the served context (`build`'s ``context_tokens``, the core's
``CapacityPlan.context_tokens``):

- served context <= original_max_position_embeddings (or none given): the short factors. Every
  position a request can reach is below the original context, where the reference takes the short
  list on every forward: the prepared model equals the reference on every sequence.
- served context > original_max_position_embeddings: the long factors at every position, and a
  notice at preparation (`Recipe.notices`). A request whose prompt is longer than the original
  context equals the reference (its prefill takes the long list for every position, and so does
  every later step); a shorter request gets the long list where the reference takes the short one.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import torch

from helios.ignition.architecture import Architecture, CheckpointError
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors
from helios.ignition.recipes.moe import rotary_order
from helios.ignition.recipes.yarn import nonzero_frequencies

ARCHITECTURES = ("Phi3ForCausalLM",)
ROPE_TYPES = ("default", "longrope")
_LONGROPE_SPELLINGS = ("longrope", "su", "yarn")  # Phi3Config reads the legacy two as longrope
_FACTOR_LISTS = ("short_factor", "long_factor")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_LARGEST_ATTENTION_FACTOR = math.sqrt(torch.finfo(torch.float32).max)  # its square is q.k's factor


class Rope(NamedTuple):
    """The resolved rotary settings: the rotated width of a head, its inverse frequencies
    [rotary / 2] and the factor on the cos/sin tables."""

    rotary: int
    inv_freq: torch.Tensor
    attention_factor: float


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None,
          context_tokens: int | None = None) -> Recipe:
    """The prepared recipe; `context_tokens` (the served prompt + output per request) chooses the
    LongRoPE factor list (see the module docstring)."""
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    head_dim = _head_dim(config)
    rope, notices = rope_from_config(config, head_dim, context_tokens)
    arch = _architecture(config, tensors, dtype, head_dim, rope.attention_factor)
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv_freq[: rope.rotary // 2] = rope.inv_freq
    order = rotary_order(head_dim, rope.rotary) if rope.rotary < head_dim else None

    def layer_weights(arch: Architecture, layer: int, take) -> list[NamedWeight]:
        return _layer_weights(arch, layer, take, order)

    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, inv_freq)
    unplaced = sorted(name for name in tensors.names - used if not name.endswith(_IGNORED_SUFFIXES))
    if unplaced and not (arch.tie_word_embeddings and unplaced == ["lm_head.weight"]):
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    return Recipe(source, arch, weights, notices=notices)


def _head_dim(config: Mapping[str, Any]) -> int:
    """Phi3Attention's head width: ``head_dim`` when config.json holds it (null breaks the reference),
    else hidden_size / num_attention_heads."""
    if "head_dim" in config and config["head_dim"] is None:
        raise UnsupportedCheckpoint("config.json: head_dim is null, which the Phi-3 reference cannot size heads by")
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _architecture(config, tensors, dtype, head_dim: int, attention_factor: float) -> Architecture:
    num_heads, num_layers = int(config["num_attention_heads"]), int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    if window == 0:  # the reference's mask then hides every key (a softmax over nothing)
        raise UnsupportedCheckpoint("config.json: sliding_window 0 leaves a query no key to attend to")
    for key in ("intermediate_size", "rms_norm_eps"):  # the reference computes with them: a null breaks it
        if config[key] is None:
            raise UnsupportedCheckpoint(f"config.json: {key} must be a number, got null")
    return Architecture(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(config["rms_norm_eps"]),
        layer_windows=(int(window or 0),) * num_layers,  # the reference slides every layer when set
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype or llama._checkpoint_dtype(config, tensors),
        rotary_factor=attention_factor,
    )


def _layer_weights(arch: Architecture, layer: int, take, order: torch.Tensor | None) -> list[NamedWeight]:
    src, dst = f"model.layers.{layer}.", f"layers.{layer}."
    qkv_name = src + "self_attn.qkv_proj.weight"
    qkv = take(qkv_name)
    rows = arch.q_size + 2 * arch.kv_size
    if tuple(qkv.shape) != (rows, arch.hidden_size):
        raise CheckpointError(f"{qkv_name} is {list(qkv.shape)}, the configuration needs [{rows}, {arch.hidden_size}]")
    if order is not None:
        qkv = _rotary_reordered(qkv, arch, order)
    return [
        NamedWeight(dst + "input_norm", take(src + "input_layernorm.weight")),
        NamedWeight(dst + "qkv.weight", qkv),
        NamedWeight(dst + "o.weight", take(src + "self_attn.o_proj.weight")),
        NamedWeight(dst + "post_norm", take(src + "post_attention_layernorm.weight")),
        NamedWeight(dst + "gate_up.weight", take(src + "mlp.gate_up_proj.weight")),
        NamedWeight(dst + "down.weight", take(src + "mlp.down_proj.weight")),
    ]


def _rotary_reordered(qkv: torch.Tensor, arch: Architecture, order: torch.Tensor) -> torch.Tensor:
    """The fused q/k/v rows with each query and key head's rows in `rotary_order` (values untouched):
    the same reordering of q and k leaves every q.k unchanged."""
    q, k, v = qkv.split([arch.q_size, arch.kv_size, arch.kv_size])
    q = q.reshape(arch.num_heads, arch.head_dim, -1)[:, order].reshape(q.shape)
    k = k.reshape(arch.num_kv_heads, arch.head_dim, -1)[:, order].reshape(k.shape)
    return torch.cat([q, k, v]).contiguous()


# ---------------------------------------------------------------------------------------------------
# Rope settings, read as Phi3Config and its rotary embedding read them.


def rope_from_config(config: Mapping[str, Any], head_dim: int,
                     context_tokens: int | None) -> tuple[Rope, tuple[str, ...]]:
    """(the rotary settings the prepared core holds, notices for whoever prepares it); an
    UnsupportedCheckpoint naming the setting where the reference refuses the configuration or would
    compute non-finite rotary tables from it."""
    params = llama.rope_settings(config)
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind in _LONGROPE_SPELLINGS else kind
    if kind not in ROPE_TYPES:
        raise UnsupportedCheckpoint(f"rope_type {kind!r} is not one of {ROPE_TYPES} (Phi3Config refuses it)")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if theta is None:
        raise UnsupportedCheckpoint("config.json: rope_theta must be a positive number, got null")
    fraction = _rotary_fraction(params, config)
    rotary = _rotary_width(fraction, head_dim)
    checked = int(int(config["hidden_size"]) // int(config["num_attention_heads"]) * fraction)
    lists = {name: _factor_list(params, name, rotary, checked) for name in _FACTOR_LISTS}
    exponents = torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary
    if kind == "default":
        return Rope(rotary, 1.0 / (float(theta) ** exponents), 1.0), ()
    original = _original_context(config)
    attention_factor = _attention_factor(params, config, original)
    for name in _FACTOR_LISTS:  # the reference requires both, whichever it ends up using
        if lists[name] is None:
            raise UnsupportedCheckpoint(f"config.json: rope_type 'longrope' has no {name!r}, which the reference "
                                        f"requires")
    use_long = context_tokens is not None and context_tokens > original
    name = "long_factor" if use_long else "short_factor"
    extension = torch.tensor(lists[name], dtype=torch.float32)
    inv_freq = nonzero_frequencies(1.0 / (extension * float(theta) ** exponents), attention_factor, float(theta))
    notices = (_long_notice(context_tokens, original),) if use_long else ()
    return Rope(rotary, inv_freq, attention_factor), notices


def _rotary_fraction(params: Mapping[str, Any], config: Mapping[str, Any]) -> float:
    """``partial_rotary_factor``: the rope dict's, else the top-level one, else 1 (a null breaks the
    reference)."""
    factor = params["partial_rotary_factor"] if "partial_rotary_factor" in params else \
        config.get("partial_rotary_factor", 1.0)
    if factor is None:
        raise UnsupportedCheckpoint("config.json: partial_rotary_factor must be a number, got null")
    return float(factor)


def _rotary_width(fraction: float, head_dim: int) -> int:
    """The rotated leading dims of a head: a positive even width within it."""
    width = int(head_dim * fraction)
    if width <= 0 or width % 2 or width > head_dim:
        raise UnsupportedCheckpoint(f"partial_rotary_factor {fraction} gives a rotary width of {width} of head_dim "
                                    f"{head_dim}, not a positive even width within the head")
    return width


def _factor_list(params: Mapping[str, Any], name: str, rotary: int, checked: int) -> list[float] | None:
    """``short_factor`` / ``long_factor`` as Phi3Config checks it (a list of numbers, one per rotated
    pair; it counts the pairs of hidden_size / num_attention_heads, `checked`, where the rotary
    embedding rotates those of head_dim, `rotary`), finite and non-zero (each divides a frequency);
    None where absent."""
    values = params.get(name)
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
        raise UnsupportedCheckpoint(f"config.json: rope {name} must be a list of numbers, got {values!r:.80}")
    if len(values) != rotary // 2:
        raise UnsupportedCheckpoint(f"config.json: rope {name} has {len(values)} entries, the rotary width "
                                    f"{rotary} needs {rotary // 2} (one per rotated pair)")
    if checked // 2 != rotary // 2:
        raise UnsupportedCheckpoint(f"config.json: rope {name} fits head_dim, not hidden_size / "
                                    f"num_attention_heads, against which the reference checks it")
    if not all(math.isfinite(x) and x != 0 for x in values):
        raise UnsupportedCheckpoint(f"config.json: rope {name} must hold finite non-zero numbers (each divides a "
                                    f"rotary frequency)")
    return [float(x) for x in values]


def _original_context(config: Mapping[str, Any]) -> int:
    original = config.get("original_max_position_embeddings")
    if original is None or original < 1:  # the reference compares positions against it and takes its log
        raise UnsupportedCheckpoint(f"config.json: rope_type 'longrope' needs a positive "
                                    f"original_max_position_embeddings, got {original!r}")
    return int(original)


def _attention_factor(params: Mapping[str, Any], config: Mapping[str, Any], original: int) -> float:
    attention_factor = params.get("attention_factor")
    if attention_factor is not None:
        if abs(attention_factor) > _LARGEST_ATTENTION_FACTOR:
            raise UnsupportedCheckpoint(f"attention_factor {attention_factor} overflows every attention logit "
                                        f"(it multiplies both queries and keys)")
        return float(attention_factor)
    factor = params.get("factor")
    if factor is None:
        longest = config.get("max_position_embeddings")
        if longest is None:
            raise UnsupportedCheckpoint("config.json: rope_type 'longrope' without a factor needs "
                                        "max_position_embeddings, got null")
        factor = longest / original
    if factor <= 1.0:
        return 1.0
    if original == 1:  # ln(1) divides
        raise UnsupportedCheckpoint("config.json: rope_type 'longrope' needs original_max_position_embeddings above 1 "
                                    "for its attention factor (its log divides), got 1")
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _long_notice(context_tokens: int, original: int) -> str:
    return (f"LongRoPE: the served context ({context_tokens} tokens) exceeds original_max_position_embeddings "
            f"({original}), so every position is rotated with long_factor; transformers rotates a sequence whose "
            f"positions stay below {original} with short_factor, so requests of at most {original} prompt tokens "
            f"may differ from it (prepare a context of at most {original} tokens for short_factor, which equals "
            f"the reference on every sequence)")
