"""``helios::token_logprobs``: exact log_softmax of the sampled distribution after penalties and
masks, the chosen token and the top alternatives in canonical order, rows independent."""

from __future__ import annotations

import pytest
import torch

import helios.abi.token_logprobs as token_logprobs  # registers the op
from helios.abi import sampling
from helios.abi.registry import AbiArgumentError
from helios.abi.sampling import NO_TOKEN

V = 70


def inputs(num_rows: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, V, generator=generator) * 3
    return dict(
        logits=logits,
        tokens=logits.argmax(dim=-1),
        penalties=torch.tensor([[1.0, 0.0, 0.0]] * num_rows),
        prompt_counts=torch.zeros(num_rows, V, dtype=torch.int32),
        output_counts=torch.zeros(num_rows, V, dtype=torch.int32),
        grammar_mask=torch.full((num_rows, (V + 31) // 32), -1, dtype=torch.int32),
        mask_rows=torch.zeros(num_rows, dtype=torch.bool),
    )


def call(args, num_top: int = 5):
    return torch.ops.helios.token_logprobs(*args.values(), num_top)


def test_greedy_rows_are_log_softmax_of_the_logits():
    args = inputs()
    chosen, top_ids, top = call(args)
    expected = torch.log_softmax(args["logits"].double(), dim=-1)
    assert torch.allclose(chosen.double(), expected.max(dim=-1).values, atol=1e-6)
    assert torch.equal(top_ids[:, 0], args["tokens"])
    reference = torch.sort(expected, dim=-1, descending=True, stable=True)
    assert torch.equal(top_ids, reference.indices[:, :5])
    assert torch.allclose(top.double(), reference.values[:, :5], atol=1e-6)


def test_penalties_and_the_grammar_mask_shape_the_distribution():
    args = inputs(2)
    args["penalties"][0] = torch.tensor([1.5, 0.5, 0.25])
    args["output_counts"][0, 3] = 2
    args["prompt_counts"][0, 4] = 1
    args["mask_rows"][1] = True
    args["grammar_mask"][1] = 0
    args["grammar_mask"][1, 0] = 0b1010  # tokens 1 and 3 allowed
    args["tokens"] = torch.tensor([3, 3])
    chosen, top_ids, top = call(args, num_top=2)
    values = args["logits"][0].double()
    values[3] = (values[3] / 1.5 if values[3] > 0 else values[3] * 1.5) - 0.25 * 2 - 0.5
    values[4] = values[4] / 1.5 if values[4] > 0 else values[4] * 1.5
    assert chosen[0].item() == pytest.approx(torch.log_softmax(values, dim=-1)[3].item(), abs=1e-6)
    allowed = args["logits"][1, [1, 3]].double()
    assert chosen[1].item() == pytest.approx(torch.log_softmax(allowed, dim=-1)[1].item(), abs=1e-6)
    assert set(top_ids[1].tolist()) == {1, 3} and torch.isfinite(top[1]).all()


def test_no_token_masked_rows_and_batch_invariance():
    args = inputs(3)
    args["tokens"][1] = NO_TOKEN
    args["mask_rows"][2] = True
    args["grammar_mask"][2] = 0
    chosen, top_ids, top = call(args)
    assert chosen[1] == float("-inf") and chosen[2] == float("-inf") and (top[2] == float("-inf")).all()
    alone = call({name: value[:1] for name, value in args.items()})
    assert torch.equal(alone[0], chosen[:1]) and torch.equal(alone[1], top_ids[:1])


def test_no_alternatives_and_bad_arguments():
    args = inputs(1)
    chosen, top_ids, top = call(args, num_top=0)
    assert top_ids.shape == (1, 0) and top.shape == (1, 0) and torch.isfinite(chosen).all()
    with pytest.raises(AbiArgumentError, match="num_top"):
        call(args, num_top=21)
    with pytest.raises(AbiArgumentError, match="tokens"):
        call({**args, "tokens": args["tokens"].int()})


def test_row_blocks_give_the_values_of_one_block(monkeypatch):
    """Rows run a few at a time (`helios.abi.sampling.row_blocks`, so that the float64 temporaries
    stay small at 256 rows of a 128k vocabulary) with the values of all rows at once."""
    args = inputs(7, seed=3)
    args["penalties"][2] = torch.tensor([1.3, 0.5, 0.25])
    args["output_counts"][2, :9] = 2
    args["mask_rows"][4] = True
    args["grammar_mask"][4, 0] = 0b1011
    args["tokens"][5] = NO_TOKEN
    whole = call(args)
    blocked_rows = []
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", 3 * V)
    rows_of = token_logprobs._logprobs_rows
    monkeypatch.setattr(token_logprobs, "_logprobs_rows", lambda logits, *rest: blocked_rows.append(len(logits))
                        or rows_of(logits, *rest))
    for got, want in zip(call(args), whole):
        assert torch.equal(got, want)
    assert blocked_rows == [3, 3, 1]
