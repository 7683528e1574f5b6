"""Recipes: the only model-specific code. Each turns a checkpoint family into an Architecture + weights.

`load_checkpoint(path)` reads a Hugging Face checkpoint directory (config.json and *.safetensors;
block-fp8 quantized weights are dequantized, `helios.ignition.recipes.fp8_blocks`),
picks the recipe registered for its declared architecture class and returns a `Recipe`. An
architecture no recipe supports raises `UnsupportedCheckpoint` naming the supported ones.

Supported: Llama, Mistral, Qwen2, Qwen3, Seed-OSS (`llama`), Ernie 4.5 dense (`ernie4_5`), Granite
(`granite`), Hunyuan dense (`hunyuan`), Qwen3-MoE, Qwen2-MoE, Mixtral, GLM-4.5 (`moe`), OLMoE (`olmoe`), Granite MoE
and Granite MoE Shared (`granite_moe`), Hunyuan MoE (`hunyuan_moe`), Ernie 4.5
MoE (`ernie4_5_moe`), DeepSeek-V3
(`deepseek`), Bamba (`bamba`), gpt-oss (`gpt_oss`), Phi-3 / Phi-3.5 / Phi-4-mini (`phi3`), SmolLM3
(`smollm3`), Gemma, Gemma 2 and VaultGemma (`gemma`), Gemma 3 text (`gemma3`), GLM-4 dense and GLM v1 (`glm4`), OLMo 2 and
OLMo 3 (`olmo`), Cohere Command R and Cohere2 (`cohere`), StarCoder2 (`starcoder2`), Phi-1 / Phi-2 (`phi`) and the Qwen vision-language decoders (`qwen_vl`).

Multi-head latent attention: DeepSeek-V3 and GLM-4.7-Flash (`deepseek`), DeepSeek-V2 and V2-Lite
(`deepseek_v2`); with DeepSeek Sparse Attention's token indexer DeepSeek-V3.2 and GLM-5
(`deepseek_v32`). dots.llm1 (`dots1`: Qwen3's attention, DeepSeek-V3's experts).
K-EXAONE (`exaone_moe`: EXAONE 4's q/k norms and NoPE global layers, DeepSeek-V3's experts).
Solar Open (`solar_open`: Llama's attention, GLM-4.5's experts in every layer). AFMoE (`afmoe`: gated attention
with NoPE full layers, four norms a layer, sigmoid experts with a choice bias). FlexOlmo (`flex_olmo`: OLMo 2's
block, OLMoE's experts). Granite SWA and Granite MoE SWA (`granite_swa`: attention sinks, sliding layers, a rope
base per layer). Code World Model (`cwm`: Llama with sliding layers), Jais 2 (`jais2`: biased LayerNorms and
Nemotron's relu^2 MLP), nanochat (`nanochat`: parameter-free norms, normed embeddings). JetMoE (`jetmoe`: a mixture of attention
heads beside experts).
Llama 4 text decoders (`llama4`: chunked local attention, NoPE layers with temperature tuning,
input-weighted sigmoid experts beside a shared expert). MiniMax-M2 (`minimax_m2`: q/k norms over whole projections,
partial rotary, sigmoid routing with a correction bias). DBRX (`dbrx`: LayerNorms, clamped q/k/v, softmax
experts in every layer). PhiMoE (`phimoe`: SparseMixer top-2 routing, LayerNorms with biases).

More dense decoders: EXAONE 4 (`exaone4`), Apertus (`apertus`), Arcee (`arcee`),
Nemotron (`nemotron`), StableLM (`stablelm`), GPT-NeoX (`gpt_neox`), Helium (`helium`),
Ministral (`ministral`), Ministral 3 text (`ministral3`), OLMo v1
(`olmo1`); InternLM3 prepares as Llama (`llama`).

Hybrid recurrent decoders: Bamba (`bamba`, Mamba2 mixers), Qwen3-Next and the Qwen3.5 text decoders
(`qwen3_next`, Gated DeltaNet linear attention and gated attention), Granite 4.0
(`granitemoehybrid`, Mamba2 mixers with Granite's multipliers and experts), Nemotron-H
(`nemotron_h`, Mamba2, attention and relu2 MLP blocks), Falcon-H1 (`falcon_h1`, attention and a
Mamba2 mixer side by side in every layer), LFM2 and LFM2-MoE (`lfm2`, gated short convolutions and attention), OLMo Hybrid (`olmo_hybrid`, Gated DeltaNet
layers and OLMo 2's attention blocks), Kimi Linear (`kimi_linear`, Kimi Delta Attention beside latent attention), the Bailing hybrid (`bailing_hybrid`,
Kimi Delta Attention beside gated rotary latent attention).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_links import check_links
from helios.ignition.recipes import (bamba, deepseek, ernie4_5, gemma3, glm4, gpt_oss, granite, hunyuan, llama, moe,
                                     cohere, olmo, phi, phi3, qwen_vl, smollm3, starcoder2)
from helios.ignition.recipes import qwen3_next
from helios.ignition.recipes import gemma
from helios.ignition.recipes import olmoe
from helios.ignition.recipes import granite_moe
from helios.ignition.recipes import hunyuan_moe
from helios.ignition.recipes import ernie4_5_moe
from helios.ignition.recipes import deepseek_v2
from helios.ignition.recipes import deepseek_v32
from helios.ignition.recipes import dots1
from helios.ignition.recipes import llama4
from helios.ignition.recipes import minimax_m2
from helios.ignition.recipes import dbrx
from helios.ignition.recipes import phimoe
from helios.ignition.recipes import granitemoehybrid
from helios.ignition.recipes import nemotron_h
from helios.ignition.recipes import falcon_h1
from helios.ignition.recipes import lfm2
from helios.ignition.recipes import olmo_hybrid
from helios.ignition.recipes import kimi_linear
from helios.ignition.recipes import bailing_hybrid
from helios.ignition.recipes import exaone4
from helios.ignition.recipes import apertus
from helios.ignition.recipes import arcee
from helios.ignition.recipes import nemotron
from helios.ignition.recipes import stablelm
from helios.ignition.recipes import gpt_neox
from helios.ignition.recipes import helium
from helios.ignition.recipes import ministral
from helios.ignition.recipes import olmo1
from helios.ignition.recipes import ministral3
from helios.ignition.recipes import exaone_moe
from helios.ignition.recipes import solar_open
from helios.ignition.recipes import afmoe
from helios.ignition.recipes import flex_olmo
from helios.ignition.recipes import granite_swa
from helios.ignition.recipes import cwm
from helios.ignition.recipes import jais2
from helios.ignition.recipes import nanochat
from helios.ignition.recipes import jetmoe
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors, read_config
from helios.ignition.recipes.defaults import with_reference_defaults
from helios.ignition.recipes.fp8_blocks import tensors_for_config

__all__ = ["NamedWeight", "Recipe", "SUPPORTED_ARCHITECTURES", "UnsupportedCheckpoint", "load_checkpoint"]

RecipeBuilder = Callable[..., Recipe]


def _vision_language(source, config, tensors, dtype) -> Recipe:
    return qwen_vl.build(source, config, tensors, dtype).recipe


_REGISTRY: dict[str, RecipeBuilder] = {
    name: family.build for family in (llama, moe, deepseek, bamba, gpt_oss, smollm3, gemma3, ernie4_5, granite,
                                      hunyuan, glm4, olmo, cohere, starcoder2, phi)
    for name in family.ARCHITECTURES
}
_REGISTRY.update({name: _vision_language for name in qwen_vl.ARCHITECTURES})
_REGISTRY.update({name: phi3.build for name in phi3.ARCHITECTURES})
_REGISTRY.update({name: qwen3_next.build for name in qwen3_next.ARCHITECTURES})
_REGISTRY.update({name: gemma.build for name in gemma.ARCHITECTURES})
_REGISTRY.update({name: olmoe.build for name in olmoe.ARCHITECTURES})
_REGISTRY.update({name: granite_moe.build for name in granite_moe.ARCHITECTURES})
_REGISTRY.update({name: hunyuan_moe.build for name in hunyuan_moe.ARCHITECTURES})
_REGISTRY.update({name: ernie4_5_moe.build for name in ernie4_5_moe.ARCHITECTURES})
_REGISTRY.update({name: deepseek_v2.build for name in deepseek_v2.ARCHITECTURES})
_REGISTRY.update({name: deepseek_v32.build for name in deepseek_v32.ARCHITECTURES})
_REGISTRY.update({name: dots1.build for name in dots1.ARCHITECTURES})
_REGISTRY.update({name: llama4.build for name in llama4.ARCHITECTURES})
_REGISTRY.update({name: minimax_m2.build for name in minimax_m2.ARCHITECTURES})
_REGISTRY.update({name: dbrx.build for name in dbrx.ARCHITECTURES})
_REGISTRY.update({name: phimoe.build for name in phimoe.ARCHITECTURES})
_REGISTRY.update({name: granitemoehybrid.build for name in granitemoehybrid.ARCHITECTURES})
_REGISTRY.update({name: nemotron_h.build for name in nemotron_h.ARCHITECTURES})
_REGISTRY.update({name: falcon_h1.build for name in falcon_h1.ARCHITECTURES})
_REGISTRY.update({name: lfm2.build for name in lfm2.ARCHITECTURES})
_REGISTRY.update({name: olmo_hybrid.build for name in olmo_hybrid.ARCHITECTURES})
_REGISTRY.update({name: kimi_linear.build for name in kimi_linear.ARCHITECTURES})
_REGISTRY.update({name: bailing_hybrid.build for name in bailing_hybrid.ARCHITECTURES})
_REGISTRY.update({name: exaone4.build for name in exaone4.ARCHITECTURES})
_REGISTRY.update({name: apertus.build for name in apertus.ARCHITECTURES})
_REGISTRY.update({name: arcee.build for name in arcee.ARCHITECTURES})
_REGISTRY.update({name: nemotron.build for name in nemotron.ARCHITECTURES})
_REGISTRY.update({name: stablelm.build for name in stablelm.ARCHITECTURES})
_REGISTRY.update({name: gpt_neox.build for name in gpt_neox.ARCHITECTURES})
_REGISTRY.update({name: helium.build for name in helium.ARCHITECTURES})
_REGISTRY.update({name: ministral.build for name in ministral.ARCHITECTURES})
_REGISTRY.update({name: olmo1.build for name in olmo1.ARCHITECTURES})
_REGISTRY.update({name: ministral3.build for name in ministral3.ARCHITECTURES})
_REGISTRY.update({name: exaone_moe.build for name in exaone_moe.ARCHITECTURES})
_REGISTRY.update({name: solar_open.build for name in solar_open.ARCHITECTURES})
_REGISTRY.update({name: afmoe.build for name in afmoe.ARCHITECTURES})
_REGISTRY.update({name: flex_olmo.build for name in flex_olmo.ARCHITECTURES})
_REGISTRY.update({name: granite_swa.build for name in granite_swa.ARCHITECTURES})
_REGISTRY.update({name: cwm.build for name in cwm.ARCHITECTURES})
_REGISTRY.update({name: jais2.build for name in jais2.ARCHITECTURES})
_REGISTRY.update({name: nanochat.build for name in nanochat.ARCHITECTURES})
_REGISTRY.update({name: jetmoe.build for name in jetmoe.ARCHITECTURES})
# The recipes whose prepared weights depend on the served context (Phi-3's LongRoPE factor list).
_CONTEXT_DEPENDENT = frozenset(phi3.ARCHITECTURES)
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(sorted(_REGISTRY))


def load_checkpoint(path: str | Path, dtype: str | None = None, context_tokens: int | None = None,
                    progress: Callable[[str], None] | None = None) -> Recipe:
    """Prepare the checkpoint at `path`; `dtype` ("float32", "bfloat16", "float16") overrides its own;
    `context_tokens` is the served context (prompt + output per request) where a recipe's weights
    depend on it (None: the recipe's choice for an unknown context, see `phi3`); `progress` gets a
    line at each tenth of the weights read (`CheckpointTensors`)."""
    directory = Path(path)
    if directory.is_dir():  # read_config names what else it is
        check_links(directory)
    config = read_config(directory)
    declared = config.get("architectures") or []
    source = declared[0] if len(declared) == 1 else None
    builder = _REGISTRY.get(source) if source else None
    if builder is None:
        raise UnsupportedCheckpoint(
            f"unsupported architecture {declared or config.get('model_type')!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    tensors = CheckpointTensors.open(directory, progress)
    _check_layer_count(config, len(tensors.names))
    config = with_reference_defaults(source, config)  # what the reference reads for missing keys
    try:  # Block-fp8 weights (quantization_config) are dequantized as the recipe reads them.
        served = {"context_tokens": context_tokens} if source in _CONTEXT_DEPENDENT else {}
        return builder(source, config, tensors_for_config(config, tensors), dtype, **served)
    except KeyError as error:  # a config key every checkpoint of the family has (the types were checked)
        raise CheckpointError(f"{directory / 'config.json'} has no {error.args[0]!r}, which the {source} "
                              f"recipe reads") from None
    # ArithmeticError: a 400-digit integer setting only one family reads overflows float().
    except (TypeError, ValueError, IndexError, RuntimeError, ArithmeticError) as error:  # a value the checks let by
        # Chained, not hidden: a recipe's own bug keeps its traceback for whoever catches this.
        raise CheckpointError(f"cannot prepare the {source} checkpoint at {directory}: {error}") from error


def _check_layer_count(config, num_tensors: int) -> None:
    """Every layer holds tensors: a larger count is a wrong config.json, refused before a recipe
    sizes per-layer tables by it."""
    for where in (config, config.get("text_config")):
        layers = where.get("num_hidden_layers") if isinstance(where, dict) else None
        if isinstance(layers, int) and layers > num_tensors:
            raise CheckpointError(f"config.json declares {layers} layers, but the checkpoint holds only "
                                  f"{num_tensors} tensors")
