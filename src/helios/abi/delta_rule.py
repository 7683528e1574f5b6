"""Execution ABI: the gated delta rule over packed rows (namespace ``helios``).

The recurrence of a Gated DeltaNet linear-attention layer (Qwen3-Next), beside the Mamba2 ops of
`helios.abi.recurrent` and with their packed geometry and state-row convention (``query_start``,
``state_rows``, ``fresh``, ``max_query_len``; see that module): a row's state is read at the start
of its packed tokens, advanced token by token and written back, so a prompt may arrive in chunks,
a decode round continues where the last stopped and a copied state row restores the exact state.
The layer's causal short convolution over q/k/v is ``helios::causal_conv_update`` (bias zeros;
the program applies SiLU), so this module adds the recurrence only.

``helios::gated_delta_rule(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
Tensor query_start, Tensor state_rows, Tensor fresh, int max_query_len) -> Tensor``
    state: float32 [S, Hv, Dk, Dv], mutated. q, k: [T, Hk, Dk]; v: [T, Hv, Dv] with Hv a multiple
    of Hk (value head h reads query/key head h // (Hv // Hk)); g: float32 [T, Hv], the log decay
    (<= 0), or float32 [T, Hv, Dk], a log decay per key channel (Kimi Delta Attention: row i of each
    head's state decays by exp(g[..., i])); beta: [T, Hv], the write strength (already a sigmoid).
    In float32, per token and value head: q and k are L2-normalised (x * rsqrt(sum x^2 + 1e-6)) and
    q scaled by Dk^-0.5; then S = diag(exp(g)) S (one factor where g is per head);
    S += k (beta (v - S^T k))^T; o = S^T q. Returns o [T, Hv, Dv] in q's dtype
    (padding tokens get zeros). This is transformers' torch_recurrent_gated_delta_rule with
    use_qk_l2norm_in_kernel=True, whose chunked form (torch_chunk_gated_delta_rule) computes the
    same recurrence; with a per-channel g, transformers' recurrent_kimi_delta_attention (KimiLinear).

The body below is the reference for every device (it runs on CUDA through torch as well; there is
no CUDA kernel of its own yet). It steps all rows together for ``max_query_len`` steps, reads
nothing on the host and allocates only step temporaries, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.recurrent import _check_rows, _Lanes, _scatter
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["GATED_DELTA_RULE_SCHEMA", "gated_delta_rule", "L2_NORM_EPS"]

GATED_DELTA_RULE_SCHEMA = (
    "(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor query_start, "
    "Tensor state_rows, Tensor fresh, int max_query_len) -> Tensor"
)
_OP = "helios::gated_delta_rule"
L2_NORM_EPS = 1e-6  # the reference's (and the FLA library's) l2norm epsilon


def check_delta_rule_args(state, q, k, v, g, beta, query_start, state_rows, fresh, max_query_len) -> None:
    """Metadata-only validation of ``helios::gated_delta_rule`` (safe on fake tensors)."""
    if not isinstance(state, torch.Tensor) or state.dim() != 4 or state.dtype != torch.float32:
        raise AbiArgumentError(f"{_OP}: state must be a float32 tensor [S, Hv, Dk, Dv]")
    _, value_heads, key_dim, value_dim = state.shape
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 3:
        raise AbiArgumentError(f"{_OP}: q must be a float tensor [T, Hk, Dk]")
    key_heads = q.shape[1]
    check_tensor(_OP, "q", q, q.dtype, (None, key_heads, key_dim))
    tokens = q.shape[0]
    check_tensor(_OP, "k", k, q.dtype, (tokens, key_heads, key_dim))
    check_tensor(_OP, "v", v, q.dtype, (tokens, value_heads, value_dim))
    if isinstance(g, torch.Tensor) and g.dim() == 3:  # per key channel (Kimi Delta Attention)
        check_tensor(_OP, "g", g, torch.float32, (tokens, value_heads, key_dim))
    else:
        check_tensor(_OP, "g", g, torch.float32, (tokens, value_heads))
    check_tensor(_OP, "beta", beta, q.dtype, (tokens, value_heads))
    if key_heads < 1 or value_heads % key_heads:
        raise AbiArgumentError(f"{_OP}: {value_heads} value heads are not a multiple of {key_heads} key heads")
    _check_rows(_OP, query_start, state_rows, fresh, max_query_len)
    check_same_device(_OP, dict(state=state, q=q, k=k, v=v, g=g, beta=beta, query_start=query_start,
                                state_rows=state_rows, fresh=fresh))


def _l2_normed(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """float32 x * rsqrt(sum x^2 + eps) over the last dim, each head repeated for its value heads."""
    x = x.to(torch.float32)
    x = x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_NORM_EPS)
    return x.repeat_interleave(repeats, dim=1) if repeats > 1 else x


@abi_op(_OP, mutates_args=("state",), schema=GATED_DELTA_RULE_SCHEMA)
def gated_delta_rule(state, q, k, v, g, beta, query_start, state_rows, fresh, max_query_len) -> torch.Tensor:
    check_delta_rule_args(state, q, k, v, g, beta, query_start, state_rows, fresh, max_query_len)
    lanes = _Lanes(query_start, state_rows, fresh, q.shape[0])
    repeats = v.shape[1] // q.shape[1]
    # Normalise every token once (the reference does it over the whole sequence before its loop).
    queries = _l2_normed(q, repeats) / (q.shape[-1] ** 0.5)
    keys = _l2_normed(k, repeats)
    original = state.index_select(0, lanes.rows)
    current = lanes.initial(state)  # [R, Hv, Dk, Dv] float32
    out = torch.zeros((q.shape[0] + 1, *v.shape[1:]), dtype=torch.float32, device=q.device)
    for j in range(max_query_len):
        token, valid = lanes.step(j)
        q_t, k_t = queries.index_select(0, token), keys.index_select(0, token)  # [R, Hv, Dk]
        v_t = v.index_select(0, token).to(torch.float32)  # [R, Hv, Dv]
        decay = g.index_select(0, token).exp()
        decay = decay[..., None, None] if g.dim() == 2 else decay[..., None]  # per head, or per key channel
        beta_t = beta.index_select(0, token).to(torch.float32).unsqueeze(-1)
        # The reference's arithmetic, term for term (torch_recurrent_gated_delta_rule).
        updated = current * decay
        remembered = (updated * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - remembered) * beta_t
        updated = updated + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        _scatter(out, token, valid, (updated * q_t.unsqueeze(-1)).sum(dim=-2))
        current = torch.where(valid.view(-1, 1, 1, 1), updated, current)
    lanes.write_back(state, current, original)
    return out[:-1].to(q.dtype)


@gated_delta_rule.register_fake
def _delta_rule_fake(state, q, k, v, g, beta, query_start, state_rows, fresh, max_query_len):
    check_delta_rule_args(state, q, k, v, g, beta, query_start, state_rows, fresh, max_query_len)
    return v.new_empty(v.shape)
