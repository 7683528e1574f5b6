"""Bias tensors against the config.json switches that build the reference's modules.

transformers builds a projection with or without a bias by its family's switch (``attention_bias``,
``mlp_bias``, Seed-OSS's ``attention_out_bias``, StarCoder2's ``use_bias``, ...) or always one way
(Mistral: none), and drops a checkpoint's bias tensor it has no module for. The recipes read the biases
from the tensors held, so such a checkpoint is refused by the setting's name rather than served with
biases the reference does not add. A switch that is on for tensors the checkpoint lacks is served: the
reference fills the missing biases with zeros, which is no bias.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from .hf_checkpoints import LLAMA2, PHI3_IDS, Family, random_model, rewritten_checkpoint, write_checkpoint
from .test_deepseek_recipe import eager_prefill_logits

PROMPT = [3, 17, 101, 5, 9, 64, 2, 88, 41, 7, 30]
_ROPE = ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0})

# (family built with its biases, config.json keys set to false, the setting the refusal names)
CASES = {
    "llama attention_bias": (LLAMA2, {"attention_bias": False}, "attention_bias false"),
    "llama mlp_bias": (LLAMA2, {"mlp_bias": False}, "mlp_bias false.*mlp.gate_proj.bias"),
    "qwen3 attention_bias": (Family("qwen3-biased", transformers.Qwen3Config, (
        ("head_dim", 16), ("attention_bias", True), ("tie_word_embeddings", False))), {"attention_bias": False},
        "attention_bias false"),
    "seed-oss attention_out_bias": (Family("seed-oss-biased", transformers.SeedOssConfig, (
        ("head_dim", 16), ("attention_bias", True), ("attention_out_bias", True), ("tie_word_embeddings", False),
        _ROPE, *PHI3_IDS)), {"attention_out_bias": False}, "attention_out_bias false.*o_proj.bias"),
    "gemma2 attention_bias": (Family("gemma2-biased", transformers.Gemma2Config, (
        ("head_dim", 16), ("sliding_window", 5), ("attention_bias", True), ("tie_word_embeddings", False), _ROPE)),
        {"attention_bias": False}, "attention_bias false"),
    "starcoder2 use_bias": (Family("starcoder2-biased", transformers.Starcoder2Config, (
        ("use_bias", True), ("tie_word_embeddings", False), _ROPE, *PHI3_IDS)), {"use_bias": False}, "use_bias false"),
    "gpt-neox attention_bias": (Family("gpt-neox-biased", transformers.GPTNeoXConfig, (
        ("attention_bias", True), ("tie_word_embeddings", False), _ROPE, *PHI3_IDS)), {"attention_bias": False},
        "attention_bias false.*query_key_value.bias"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bias_tensors_the_reference_drops_are_refused_by_setting(tmp_path, case):
    family, switches, message = CASES[case]
    directory = write_checkpoint(random_model(family), tmp_path / "original")
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(directory, tmp_path, lambda config: config.update(switches)))


def test_a_family_without_biases_refuses_bias_tensors(tmp_path):
    """A Llama checkpoint with q/k/v/o biases relabelled Mistral, whose attention has none."""
    directory = write_checkpoint(random_model(LLAMA2), tmp_path / "original")

    def as_mistral(config):
        config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)

    with pytest.raises(UnsupportedCheckpoint, match="MistralForCausalLM has no self_attn.q_proj.bias"):
        load_checkpoint(rewritten_checkpoint(directory, tmp_path, as_mistral))


def test_a_switch_on_for_missing_bias_tensors_is_served_as_the_reference_fills_them(tmp_path):
    """attention_bias and mlp_bias on, no bias tensors: transformers zero-fills the biases it builds."""
    plain = Family("llama-plain", transformers.LlamaConfig, (("tie_word_embeddings", False),))
    directory = write_checkpoint(random_model(plain), tmp_path / "original")
    directory = rewritten_checkpoint(directory, tmp_path,
                                     lambda config: config.update(attention_bias=True, mlp_bias=True))
    assert json.loads((directory / "config.json").read_text())["attention_bias"]
    reference = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                              attn_implementation="eager")
    recipe = load_checkpoint(directory)
    assert not recipe.architecture.qkv_bias
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0, -1]
    torch.testing.assert_close(eager_prefill_logits(recipe, PROMPT), expected, rtol=1e-4, atol=1e-4)
