"""The Apertus recipe against transformers' ApertusForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py): per-head q/k RMS norms, the non-gated xIELU MLP whose learned
scalars are drawn per layer, q/k/v/o biases, a llama3-scaled rope, untied. Prefill logits, scored
log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the reference's
(test_equivalence's checks and tolerances); the prepared layout is the reference's weights, its ``mlp_act`` slot
xIELU's effective scalars, which matter; xIELU equals transformers' activation on values of both signs; a terse
config.json takes ApertusConfig's defaults; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.activations import plain_activation, xielu_parameters
from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import APERTUS, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(APERTUS)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def _effective(act) -> torch.Tensor:
    """transformers' xIELU scalars as its forward uses them."""
    softplus = torch.nn.functional.softplus
    return torch.cat((softplus(act.alpha_p), act.beta + softplus(act.alpha_n), act.beta[None], act.eps[None]))


def test_the_prepared_weights_are_the_references(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.model
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert not arch.gated_mlp and arch.mlp_activation == "xielu" and arch.qk_norm and not arch.mlp_bias
    assert arch.qkv_bias and arch.o_bias
    norms = {"input_norm": layer.attention_layernorm, "post_norm": layer.feedforward_layernorm,
             "q_norm": layer.self_attn.q_norm, "k_norm": layer.self_attn.k_norm}
    for slot, norm in norms.items():
        assert torch.equal(weights[f"layers.1.{slot}"], norm.weight), slot
    assert torch.equal(weights["layers.1.up.weight"], layer.mlp.up_proj.weight)
    with torch.no_grad():
        assert torch.equal(weights["layers.1.mlp_act"], _effective(layer.mlp.act_fn))
    assert not torch.equal(weights["layers.0.mlp_act"], weights["layers.1.mlp_act"])


def test_xielu_equals_the_references_activation():
    """Both signs, the eps clamp's neighbourhood, and buffers away from their defaults."""
    act = transformers.activations.XIELUActivation(alpha_p_init=0.6, alpha_n_init=1.1, beta=0.3, eps=-1e-3,
                                                   dtype=torch.float32)
    x = torch.cat((torch.randn(200, generator=torch.Generator().manual_seed(0)) * 3, torch.tensor([-1e-3, 0.0, 1e-7])))
    params = xielu_parameters(act.alpha_p, act.alpha_n, act.beta, act.eps)
    with torch.no_grad():
        assert torch.equal(plain_activation("xielu", x, params), act(x))
        assert not torch.equal(plain_activation("xielu", x, xielu_parameters(act.alpha_p, act.alpha_n, None, None)),
                               act(x))


def test_the_learned_scalars_matter(prepared):
    """With every layer's scalars at the initial ones the logits differ by more than ten times the tolerance."""
    initial = _effective(transformers.activations.XIELUActivation(dtype=torch.float32)).detach()
    swapped = [initial if w.name.endswith("mlp_act") else w.tensor for w in prepared.recipe.weights]
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), weights=swapped)


def test_the_new_activations_are_refused_for_a_gated_mlp(prepared):
    """gelu, relu2 and xielu have no gated op: an Architecture asking for one is refused naming the field."""
    import dataclasses

    from helios.ignition.architecture import CheckpointError

    for name in ("gelu", "relu2", "xielu"):
        with pytest.raises(CheckpointError, match="mlp_activation"):
            dataclasses.replace(prepared.recipe.architecture, gated_mlp=True, mlp_activation=name)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(APERTUS, seed=4), tmp_path_factory.mktemp("apertus-checkpoint"))


def test_a_terse_config_takes_the_references_defaults(checkpoint, tmp_path):
    """hidden_act, rms_norm_eps and the rope settings left out are ApertusConfig's: xielu, 1e-5 and llama3 over
    theta 1.2e7 (a top-level rope_theta alone does not change it, as in the reference)."""
    def edit(config):
        for key in ("hidden_act", "rms_norm_eps", "rope_parameters"):
            config.pop(key)
        config["rope_theta"] = 1000.0

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory)
    recipe = load_checkpoint(directory)
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert arch.mlp_activation == "xielu" and arch.rms_norm_eps == reference.config.rms_norm_eps == 1e-5
    assert torch.equal(weights["rope.inv_freq"], reference.model.rotary_emb.inv_freq)
    assert reference.config.rope_parameters["rope_theta"] == 12_000_000.0


def test_relu2_takes_no_scalars(checkpoint, tmp_path):
    def edit(config):
        config["hidden_act"] = "relu2"

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    for path in directory.glob("*.safetensors"):  # ApertusMLP holds no xIELU module then
        from safetensors.torch import load_file, save_file
        save_file({k: v for k, v in load_file(path).items() if ".act_fn." not in k}, path, metadata={"format": "pt"})
    arch = load_checkpoint(directory).architecture
    assert arch.mlp_activation == "relu2" and not any(s.name.endswith("mlp_act") for s in weight_layout(arch))


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="swish"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "a partial rotary": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.5),
                         "partial_rotary_factor"),
    "a null head_dim": (lambda config: config.update(head_dim=None), "head_dim"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_apertus_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])
