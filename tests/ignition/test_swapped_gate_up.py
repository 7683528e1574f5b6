"""The gated MLP's swapped gate/up product (`helios.ignition.decoder.SWAPPED_GATE_UP_TOKENS`):
exported programs that use it still match transformers (float32 logits within 1e-4, identical
greedy tokens), and the product really is the swapped one in their graphs."""

from __future__ import annotations

import torch

from helios.ignition import decoder

from .conftest import _prepare
from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import LLAMA3
from .test_equivalence import NEW_TOKENS, assert_matches_reference, random_prompt


def swapped_products(module) -> int:
    """mm nodes whose first operand is a weight (the swapped product) in a loaded program's graph."""
    return sum(1 for node in module.graph.nodes if node.target is torch.ops.aten.mm.default)


def test_swapped_gate_up_programs_match_transformers(tmp_path, monkeypatch):
    monkeypatch.setattr(decoder, "SWAPPED_GATE_UP_TOKENS", 1)  # every program, decode included
    prepared = _prepare(LLAMA3, tmp_path)
    layers = prepared.recipe.architecture.num_layers
    assert all(swapped_products(module) == layers for _, module in prepared.programs.values())
    prompt = random_prompt(13, seed=3)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], NEW_TOKENS, chunk=16)
    assert_matches_reference(prepared, sequence, prompt)


def test_the_product_is_swapped_from_the_token_threshold_only(monkeypatch):
    weight, hidden = torch.randn(12, 8), torch.randn(5, 8)
    monkeypatch.setattr(decoder, "SWAPPED_GATE_UP_TOKENS", 6)
    plain = decoder.gate_up_product(hidden, weight, None)
    assert plain.is_contiguous()
    monkeypatch.setattr(decoder, "SWAPPED_GATE_UP_TOKENS", 5)
    swapped = decoder.gate_up_product(hidden, weight, None)
    assert swapped.stride() == (1, 5) and torch.allclose(swapped, plain, atol=1e-6)
    bias = torch.randn(12)
    assert decoder.gate_up_product(hidden, weight, bias).is_contiguous()  # a bias keeps F.linear
