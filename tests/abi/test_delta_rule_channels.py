"""``helios::gated_delta_rule`` with a log decay per key channel (g [T, Hv, Dk]: Kimi Delta Attention)
against transformers' recurrent_kimi_delta_attention: one pass, the same tokens in chunks and decode steps
through a carried state row, padding and inactive rows; the fake's shapes and a misshapen g refused by
name; the body captures (no host reads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helios.abi.delta_rule  # noqa: F401
from helios.abi.registry import AbiArgumentError
from support.host_sync import forbid_host_sync

H, DK, DV, T = 3, 8, 6, 9


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return dict(q=torch.randn(T, H, DK, generator=gen), k=torch.randn(T, H, DK, generator=gen),
                v=torch.randn(T, H, DV, generator=gen),
                g=-F.softplus(torch.randn(T, H, DK, generator=gen)) * 2, beta=torch.rand(T, H, generator=gen))


def _reference(x):
    from transformers.models.kimi_linear import modeling_kimi_linear as reference  # at first use: a light collection

    out, state = reference.recurrent_kimi_delta_attention(
        *(x[name].unsqueeze(0) for name in ("q", "k", "v")), g=x["g"].unsqueeze(0), beta=x["beta"].unsqueeze(0),
        initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out[0], state[0]


def _rule(state, x, lengths, rows, fresh, offset=0):
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    sl = slice(offset, offset + starts[-1])
    return torch.ops.helios.gated_delta_rule(
        state, x["q"][sl], x["k"][sl], x["v"][sl], x["g"][sl], x["beta"][sl],
        torch.tensor(starts, dtype=torch.int32), torch.tensor(rows), torch.tensor(fresh), max(lengths))


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=2e-5)


def test_per_channel_decay_equals_kimi_delta_attention_in_one_pass_chunks_and_steps():
    x = _inputs()
    whole, final = _reference(x)
    one = torch.zeros(1, H, DK, DV)
    _close(_rule(one, x, [T], [0], [True]), whole)
    _close(one[0], final)
    state = torch.randn(3, H, DK, DV)
    untouched = state[1].clone()
    _close(_rule(state, x, [0, 4], [-1, 2], [False, True]), whole[:4])  # an empty inactive row in front
    _close(_rule(state, x, [1], [2], [False], offset=4), whole[4:5])
    _close(_rule(state, x, [4], [2], [False], offset=5), whole[5:])
    _close(state[2], final)
    assert torch.equal(state[1], untouched)
    per_head = dict(x, g=x["g"].mean(-1))  # one decay per head is another recurrence
    assert (torch.ops.helios.gated_delta_rule(
        torch.zeros(1, H, DK, DV), *(per_head[n] for n in ("q", "k", "v", "g", "beta")),
        torch.tensor([0, T], dtype=torch.int32), torch.tensor([0]), torch.tensor([True]), T) - whole).abs().max() > 1e-3


def test_fake_shapes_a_misshapen_decay_and_capture():
    x = _inputs(1)
    args = (torch.tensor([0, T], dtype=torch.int32), torch.tensor([0]), torch.tensor([True]), T)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(t) for name, t in x.items()}
        out = torch.ops.helios.gated_delta_rule(mode.from_tensor(torch.zeros(1, H, DK, DV)),
                                                *(fake[n] for n in ("q", "k", "v", "g", "beta")),
                                                *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                                  for a in args))
        assert out.shape == (T, H, DV)
    with pytest.raises(AbiArgumentError, match="g"):
        torch.ops.helios.gated_delta_rule(torch.zeros(1, H, DK, DV), x["q"], x["k"], x["v"], x["g"][..., :DK - 1],
                                          x["beta"], *args)
    state = torch.zeros(1, H, DK, DV)
    with forbid_host_sync():
        torch.ops.helios.gated_delta_rule(state, x["q"], x["k"], x["v"], x["g"], x["beta"], *args)
