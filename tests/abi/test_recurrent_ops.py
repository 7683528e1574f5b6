"""helios::causal_conv_update and helios::ssm_scan: chunking, batching and inactive rows."""

from __future__ import annotations

import pytest
import torch

import helios.abi.recurrent  # noqa: F401
from helios.abi.registry import AbiArgumentError

H, P, N, G, CH, K = 4, 3, 5, 2, 6, 4


def _inputs(tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        x=torch.randn(tokens, H, P, generator=g), dt=torch.rand(tokens, H, generator=g) + 0.1,
        B=torch.randn(tokens, G, N, generator=g), C=torch.randn(tokens, G, N, generator=g),
        u=torch.randn(tokens, CH, generator=g),
    )


def _run(v, lengths, rows, fresh, ssm, conv, weight, bias, A, offset=0):
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    total = starts[-1]
    sl = slice(offset, offset + total)
    qs = torch.tensor(starts, dtype=torch.int32)
    rows_t, fresh_t = torch.tensor(rows), torch.tensor(fresh)
    y = torch.ops.helios.ssm_scan(ssm, v["x"][sl], v["dt"][sl], A, v["B"][sl], v["C"][sl], qs, rows_t, fresh_t,
                                  max(lengths))
    c = torch.ops.helios.causal_conv_update(conv, v["u"][sl], weight, bias, qs, rows_t, fresh_t, max(lengths))
    return y, c


def _reference(v, A, weight, bias):
    """Plain token-by-token recurrence of one sequence from zero state."""
    h = torch.zeros(H, P, N)
    window = torch.zeros(CH, K - 1)
    ys, cs = [], []
    for t in range(v["x"].shape[0]):
        b = v["B"][t].repeat_interleave(H // G, 0)
        c = v["C"][t].repeat_interleave(H // G, 0)
        h = h * torch.exp(v["dt"][t] * A)[:, None, None] + (v["dt"][t][:, None] * v["x"][t])[..., None] * b[:, None]
        ys.append(h @ c[..., None])
        full = torch.cat((window, v["u"][t][:, None]), -1)
        cs.append((full * weight).sum(-1) + bias)
        window = full[:, 1:]
    return torch.stack(ys).squeeze(-1), torch.stack(cs)


def test_chunks_and_batching_equal_one_pass():
    v = _inputs(9)
    A, weight, bias = -torch.rand(H) - 0.5, torch.randn(CH, K), torch.randn(CH)
    ref_y, ref_c = _reference(v, A, weight, bias)
    ssm, conv = torch.randn(3, H, P, N), torch.randn(3, CH, K - 1)  # garbage state: fresh rows ignore it
    untouched = ssm[0].clone(), conv[0].clone()
    # first chunk: 5 tokens into state row 2, with an inactive padding row in front
    y, c = _run(v, [0, 5], [-1, 2], [False, True], ssm, conv, weight, bias, A)
    torch.testing.assert_close(y, ref_y[:5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, ref_c[:5], rtol=1e-5, atol=1e-5)
    # the rest continues from the state row, one and three tokens at a time
    y, c = _run(v, [1], [2], [False], ssm, conv, weight, bias, A, offset=5)
    torch.testing.assert_close(y, ref_y[5:6], rtol=1e-5, atol=1e-5)
    y, c = _run(v, [3], [2], [False], ssm, conv, weight, bias, A, offset=6)
    torch.testing.assert_close(y, ref_y[6:9], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, ref_c[6:9], rtol=1e-5, atol=1e-5)
    assert torch.equal(ssm[0], untouched[0]) and torch.equal(conv[0], untouched[1])


def test_two_rows_of_different_lengths_and_padding_tokens():
    v = _inputs(8, seed=1)
    A, weight, bias = -torch.rand(H) - 0.5, torch.randn(CH, K), torch.randn(CH)
    ssm, conv = torch.zeros(2, H, P, N), torch.zeros(2, CH, K - 1)
    starts = torch.tensor([0, 2, 7], dtype=torch.int32)  # token 7 is padding
    y = torch.ops.helios.ssm_scan(ssm, v["x"], v["dt"], A, v["B"], v["C"], starts, torch.tensor([1, 0]),
                                  torch.tensor([True, True]), 8)
    first = {k: t[:2] for k, t in v.items()}
    second = {k: t[2:7] for k, t in v.items()}
    torch.testing.assert_close(y[:2], _reference(first, A, weight, bias)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[2:7], _reference(second, A, weight, bias)[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(y[7], torch.zeros_like(y[7]))


def test_bad_arguments_are_refused():
    v = _inputs(2)
    starts = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(AbiArgumentError, match="float32"):
        torch.ops.helios.ssm_scan(torch.zeros(1, H, P, N, dtype=torch.float64), v["x"], v["dt"], -torch.ones(H),
                                  v["B"], v["C"], starts, torch.tensor([0]), torch.tensor([True]), 2)
    with pytest.raises(AbiArgumentError, match="max_query_len"):
        torch.ops.helios.causal_conv_update(torch.zeros(1, CH, K - 1), v["u"], torch.ones(CH, K), torch.ones(CH),
                                            starts, torch.tensor([0]), torch.tensor([True]), 0)
