"""Recipe for Gemma and Gemma 2 checkpoints: GemmaForCausalLM (transformers' GemmaConfig: Gemma 1 2B and
7B, CodeGemma, Gemma 1.1) and Gemma2ForCausalLM (Gemma2Config: Gemma 2 2B, 9B, 27B); and VaultGemma
(VaultGemmaForCausalLM: Gemma 2 without the sandwich norms, see the end).

Both are Llama's grouped-query attention with Gemma 3's pieces (`helios.ignition.recipes.gemma3`):
every RMSNorm's weight folded to ``1 + w`` at preparation (the reference's
``norm(x.float()) * (1 + w.float())``), the gated MLP's tanh-approximated GELU
(``helios::gelu_tanh_mul``) and the embeddings times sqrt(hidden_size) rounded to the model dtype
(``embedding_scale``). ``head_dim`` may differ from hidden_size / heads (Gemma 7B: 16 heads of 256
over 3072). One rope table (``rope_parameters`` or the legacy top-level spelling; Llama's checked rope
types, YaRN's attention factor on the cos/sin tables) for every layer; no q/k norms.

Gemma 1: the attention scale is ``head_dim ** -0.5``, every layer attends fully and the norms are
Llama's (input norm, post-attention norm before the MLP). The reference's activation is
``hidden_act`` (its legacy ``"gelu"`` means the tanh approximation, as GemmaConfig converts it);
``hidden_activation`` (older config.json files) is accepted where it names the same.

Gemma 2, beside those:

- sandwich norms (``sandwich_norms``): ``post_attention_layernorm`` on the attention output and
  ``post_feedforward_layernorm`` on the MLP output before each residual add; ``pre_feedforward_layernorm``
  is the prepared ``post_norm``;
- the activation is ``hidden_activation`` (Gemma2MLP reads no ``hidden_act``);
- ``layer_types`` (default, as Gemma2Config fills it: even layers slide, odd layers attend fully)
  with the reference's window convention (a sliding query sees its last ``sliding_window`` positions,
  its own included);
- the attention scale ``query_pre_attn_scalar ** -0.5``;
- ``attn_logit_softcapping``: every scaled attention score capped at ``tanh(s / c) * c`` before the
  mask (``attention_softcap``, ``helios::paged_attention_softcap``); null: no cap;
- ``final_logit_softcapping``: the logits capped the same way on every logits path (``logit_softcap``);
  null: no cap.

VaultGemma is Gemma 2 (activation, layer kinds, scale, soft caps, Gemma2Config's defaults) whose
layers keep only ``input_layernorm`` and ``pre_feedforward_layernorm`` (the prepared ``post_norm``): no
norm on the attention or MLP output.

Refused by name: another activation, ``use_bidirectional_attention``, a non-positive or non-numeric
soft cap or ``query_pre_attn_scalar``, malformed ``layer_types``, a sliding layer without a positive
window, rope types Llama's recipe refuses.
"""

from __future__ import annotations

from typing import Any, Mapping

from helios.ignition.architecture import Architecture
from helios.ignition.recipes import gemma3, llama
from helios.ignition.recipes.base import Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

GEMMA, GEMMA2, VAULTGEMMA = "GemmaForCausalLM", "Gemma2ForCausalLM", "VaultGemmaForCausalLM"
ARCHITECTURES = (GEMMA, GEMMA2, VAULTGEMMA)
ACTIVATIONS = ("gelu_pytorch_tanh",)  # and Gemma 1's legacy "gelu" (hidden_act), the same function


def build(source: str, config: Mapping[str, Any], tensors: CheckpointTensors, dtype: str | None) -> Recipe:
    arch = architecture_from_config(source, config, tensors, dtype)
    # Gemma 2's slots are Gemma 3's sandwich-norm slots (no q/k norms here); Gemma 1's are Llama's.
    layer_weights = {GEMMA2: gemma3._layer_weights, VAULTGEMMA: _unsandwiched_layer_weights}.get(source)
    weights, used = llama.prepared_weights(arch, config, tensors, layer_weights, transform=gemma3._folded_norm)
    return llama.placed_recipe(source, arch, weights, used, tensors)


def architecture_from_config(source: str, config: Mapping[str, Any], tensors: CheckpointTensors,
                             dtype: str | None) -> Architecture:
    _check_activation(source, config)
    llama.check_declared_biases(source, config, tensors)  # gemma_fields reads the biases the tensors hold
    if config.get("use_bidirectional_attention"):
        raise UnsupportedCheckpoint("use_bidirectional_attention is not supported (the programs attend causally)")
    num_layers = int(config["num_hidden_layers"])
    for key in ("head_dim", "intermediate_size", "rms_norm_eps"):
        if config[key] is None:  # the reference computes with them: a null breaks it
            raise UnsupportedCheckpoint(f"config.json: {key} must be a number, got null")
    common = dict(
        **gemma3.gemma_fields(config, tensors, dtype),
        rotary_factor=llama.rope_attention_factor(config),  # YaRN's factor on cos/sin, as the reference's rope
    )
    if source == GEMMA:
        return Architecture(**common, layer_windows=(0,) * num_layers)
    return Architecture(
        **common,
        layer_windows=llama.sliding_layer_windows(config, layer_types(config, num_layers)),
        sandwich_norms=source == GEMMA2,
        query_pre_attn_scalar=_positive(config, "query_pre_attn_scalar", nullable=False),
        attention_softcap=_positive(config, "attn_logit_softcapping"),
        logit_softcap=_positive(config, "final_logit_softcapping"),
    )


def _unsandwiched_layer_weights(arch: Architecture, layer: int, take) -> list:
    """A VaultGemma layer's slots: Llama's, the norm before the MLP read from ``pre_feedforward_layernorm``."""
    def read(name: str):
        return take(name.replace("post_attention_layernorm", "pre_feedforward_layernorm"))
    return llama.attention_weights(arch, layer, read) + llama.dense_mlp_weights(arch, layer, take)


def _check_activation(source: str, config: Mapping[str, Any]) -> None:
    """The MLP activation the reference reads: GemmaMLP's ``hidden_act`` ("gelu" converted to the tanh
    approximation), Gemma2MLP's ``hidden_activation``; Gemma 1's ``hidden_activation``, which
    transformers 5 ignores, must not name another."""
    if source == GEMMA:
        act = config.get("hidden_act", "gelu_pytorch_tanh")
        if act not in (*ACTIVATIONS, "gelu"):
            raise UnsupportedCheckpoint(f"hidden_act {act!r} is not supported (only 'gelu_pytorch_tanh' or 'gelu')")
        named = config.get("hidden_activation")
        if named is not None and named not in ACTIVATIONS:
            raise UnsupportedCheckpoint(f"hidden_activation {named!r} is not supported (only {ACTIVATIONS[0]!r})")
        return
    act = config.get("hidden_activation")
    if act not in ACTIVATIONS:
        raise UnsupportedCheckpoint(f"hidden_activation {act!r} is not supported (only {ACTIVATIONS[0]!r})")


def _positive(config: Mapping[str, Any], key: str, nullable: bool = True) -> float:
    """config.json's `key` as a positive float; a null (where the reference reads it as "none") is 0."""
    value = config.get(key)
    if value is None and nullable:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        kind = "a positive number or null" if nullable else "a positive number"
        raise UnsupportedCheckpoint(f"config.json: {key} must be {kind}, got {value!r}")
    return float(value)


def layer_types(config: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as Gemma2Config resolves it: ``layer_types``, else even layers
    slide and odd layers attend fully."""
    kinds = config.get("layer_types")
    if kinds is None:
        return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers))
    return llama.listed_layer_types(kinds, num_layers)

