"""helios::gated_delta_rule (and helios::causal_conv_update as Qwen3-Next's short convolution) against
transformers' Gated DeltaNet functions: a prompt in chunks equals one pass, decode after prefill
equals the whole sequence, batched rows, padding tokens, inactive rows and a carried initial state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helios.abi.delta_rule  # noqa: F401
import helios.abi.recurrent  # noqa: F401
from helios.abi.registry import AbiArgumentError


def _hf():
    """transformers' Qwen3-Next module, imported at first use (it loads the modeling stack: a light collection)."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


HK, HV, DK, DV, CH, K = 2, 4, 8, 6, 10, 4


def _inputs(tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(tokens, HK, DK, generator=gen), k=torch.randn(tokens, HK, DK, generator=gen),
        v=torch.randn(tokens, HV, DV, generator=gen),
        g=-F.softplus(torch.randn(tokens, HV, generator=gen)) * torch.rand(HV, generator=gen) * 4,
        beta=torch.rand(tokens, HV, generator=gen), u=torch.randn(tokens, CH, generator=gen),
    )


def _reference(v, sl=slice(None), initial=None, chunked=True):
    """transformers' rule over one sequence (batch of 1): (output [T, Hv, Dv], final state [Hv, Dk, Dv])."""
    args = [v[name][sl].unsqueeze(0) for name in ("q", "k", "v")]
    kwargs = dict(g=v["g"][sl].unsqueeze(0), beta=v["beta"][sl].unsqueeze(0), output_final_state=True,
                  use_qk_l2norm_in_kernel=True, initial_state=None if initial is None else initial.unsqueeze(0))
    if chunked:
        out, state = _hf().torch_chunk_gated_delta_rule(*args, chunk_size=4, **kwargs)
    else:
        out, state = _hf().torch_recurrent_gated_delta_rule(*args, **kwargs)
    return out[0], state[0]


def _rule(state, v, lengths, rows, fresh, offset=0):
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    sl = slice(offset, offset + starts[-1])
    return torch.ops.helios.gated_delta_rule(
        state, v["q"][sl], v["k"][sl], v["v"][sl], v["g"][sl], v["beta"][sl], torch.tensor(starts, dtype=torch.int32),
        torch.tensor(rows), torch.tensor(fresh), max(lengths))


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=2e-5)


def test_a_prompt_in_chunks_equals_one_pass_of_the_reference():
    v = _inputs(11)
    whole, final = _reference(v)
    stepped, _ = _reference(v, chunked=False)
    _close(stepped, whole)  # the reference's two forms agree (the op follows the token-by-token one)
    state = torch.randn(3, HV, DK, DV)  # garbage state: a fresh row ignores it
    untouched = state[0].clone()
    one_pass = torch.zeros(1, HV, DK, DV)
    _close(_rule(one_pass, v, [11], [0], [True]), whole)
    _close(one_pass[0], final)
    # 5 tokens (an empty inactive row in front), then 1 and 5 more continuing from state row 2
    _close(_rule(state, v, [0, 5], [-1, 2], [False, True]), whole[:5])
    _close(_rule(state, v, [1], [2], [False], offset=5), whole[5:6])
    _close(_rule(state, v, [5], [2], [False], offset=6), whole[6:11])
    _close(state[2], final)
    assert torch.equal(state[0], untouched)


def test_decode_after_prefill_equals_the_whole_sequence():
    v = _inputs(10, seed=1)
    whole, final = _reference(v)
    state = torch.zeros(1, HV, DK, DV)
    outputs = [_rule(state, v, [6], [0], [True])]
    for position in range(6, 10):  # one token per round, as a decode program runs
        outputs.append(_rule(state, v, [1], [0], [False], offset=position))
    _close(torch.cat(outputs), whole)
    _close(state[0], final)


def test_batched_rows_padding_tokens_and_a_carried_state():
    v = _inputs(9, seed=2)
    carried = torch.randn(HV, DK, DV) * 0.3
    state = torch.stack((torch.zeros(HV, DK, DV), carried.clone()))
    starts = torch.tensor([0, 3, 8], dtype=torch.int32)  # token 8 is padding
    out = torch.ops.helios.gated_delta_rule(state, v["q"], v["k"], v["v"], v["g"], v["beta"], starts,
                                            torch.tensor([1, 0]), torch.tensor([False, True]), 9)
    first, first_state = _reference(v, slice(0, 3), initial=carried)
    second, second_state = _reference(v, slice(3, 8))
    _close(out[:3], first)
    _close(out[3:8], second)
    assert torch.equal(out[8], torch.zeros_like(out[8]))
    _close(state[1], first_state)
    _close(state[0], second_state)


def test_the_short_convolution_is_causal_conv_update_without_bias():
    """Qwen3-Next's conv1d (no bias, SiLU) through helios::causal_conv_update in chunks."""
    v = _inputs(9, seed=3)
    weight = torch.randn(CH, K)
    expected = _hf().causal_conv1d_fn(v["u"].T.unsqueeze(0), weight, None, activation="silu")[0].T
    conv = torch.randn(1, CH, K - 1)
    outputs, start = [], 0
    for length in (4, 1, 4):
        qs = torch.tensor([0, length], dtype=torch.int32)
        y = torch.ops.helios.causal_conv_update(conv, v["u"][start:start + length], weight, torch.zeros(CH), qs,
                                                torch.tensor([0]), torch.tensor([start == 0]), length)
        outputs.append(F.silu(y))
        start += length
    _close(torch.cat(outputs), expected)


def test_fake_shapes_and_bad_arguments():
    v = _inputs(2)
    starts, rows, fresh = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0]), torch.tensor([True])
    meta = {name: t.to("meta") for name, t in v.items()}
    out = torch.ops.helios.gated_delta_rule(torch.zeros(1, HV, DK, DV, device="meta"), meta["q"], meta["k"],
                                            meta["v"], meta["g"], meta["beta"], starts.to("meta"), rows.to("meta"),
                                            fresh.to("meta"), 2)
    assert out.shape == (2, HV, DV) and out.dtype == torch.float32
    with pytest.raises(AbiArgumentError, match="float32"):
        torch.ops.helios.gated_delta_rule(torch.zeros(1, HV, DK, DV, dtype=torch.float64), v["q"], v["k"], v["v"],
                                          v["g"], v["beta"], starts, rows, fresh, 2)
    with pytest.raises(AbiArgumentError, match="multiple"):
        torch.ops.helios.gated_delta_rule(torch.zeros(1, 3, DK, DV), v["q"], v["k"], v["v"][:, :3], v["g"][:, :3],
                                          v["beta"][:, :3], starts, rows, fresh, 2)
    with pytest.raises(AbiArgumentError, match="max_query_len"):
        torch.ops.helios.gated_delta_rule(torch.zeros(1, HV, DK, DV), v["q"], v["k"], v["v"], v["g"], v["beta"],
                                          starts, rows, fresh, 0)
