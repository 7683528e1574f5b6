"""Execution ABI: recurrent state updates over packed rows (namespace ``helios``).

Two custom ops that hybrid programs call for their recurrent layers (a causal depthwise convolution
and a diagonal selective state-space scan, the Mamba2 recurrence). State lives in state rows of
persistent planes (a contract's RECURRENT history region); the ops read a row's state at the start
of its packed tokens, advance it token by token and write it back, so a prompt may arrive in
chunks, a decode round continues where the last round stopped, and a snapshot of the rows (a
runtime copy) restores the exact state.

Packed geometry (as `helios.abi.attention`): R rows over T packed tokens; row r owns tokens
[query_start[r], query_start[r+1]). ``state_rows`` int64 [R] names each row's state row (-1: an
inactive row, whose state is neither read nor written); ``fresh`` bool [R] starts a row from zero
state (its first token is position 0). ``max_query_len`` is a static bound on any row's token count
(1 for decode programs): the ops advance all rows together, one token per step, for that many
steps. They read nothing on the host and allocate only step temporaries, so one implementation
serves the CPU and CUDA and can be captured in a CUDA graph.

``helios::causal_conv_update(Tensor(a!) conv_state, Tensor x, Tensor weight, Tensor bias,
Tensor query_start, Tensor state_rows, Tensor fresh, int max_query_len) -> Tensor``
    conv_state: [S, C, K - 1], the last K - 1 inputs of each state row (oldest first), mutated.
    x: [T, C]; weight: [C, K] (depthwise; tap K - 1 multiplies the newest input); bias: [C].
    Returns y [T, C]: y[t] = bias + sum_k weight[:, k] * window[k], window = the K inputs ending at
    token t (earlier ones from the state). Padding tokens get zeros. Arithmetic in x's dtype.

``helios::ssm_scan(Tensor(a!) ssm_state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C,
Tensor query_start, Tensor state_rows, Tensor fresh, int max_query_len) -> Tensor``
    ssm_state: float32 [S, H, P, N], mutated. x: [T, H, P]; dt: [T, H] (already discretised:
    positive step sizes); A: float32 [H] (negative decay rates); B, C: [T, G, N] with H a multiple
    of G (head h reads group h // (H // G)). Per token: h = exp(dt A) h + dt x (x) B, y = h C.
    Returns y float32 [T, H, P] (no skip term; the program adds D x). Padding tokens get zeros.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["CAUSAL_CONV_UPDATE_SCHEMA", "SSM_SCAN_SCHEMA", "causal_conv_update", "ssm_scan"]

CAUSAL_CONV_UPDATE_SCHEMA = (
    "(Tensor(a!) conv_state, Tensor x, Tensor weight, Tensor bias, Tensor query_start, Tensor state_rows, "
    "Tensor fresh, int max_query_len) -> Tensor"
)
SSM_SCAN_SCHEMA = (
    "(Tensor(a!) ssm_state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor query_start, "
    "Tensor state_rows, Tensor fresh, int max_query_len) -> Tensor"
)
_CONV, _SCAN = "helios::causal_conv_update", "helios::ssm_scan"


def _check_rows(op: str, query_start, state_rows, fresh, max_query_len: int) -> int:
    check_tensor(op, "state_rows", state_rows, torch.int64, (None,))
    rows = state_rows.shape[0]
    check_tensor(op, "query_start", query_start, torch.int32, (rows + 1,))
    check_tensor(op, "fresh", fresh, torch.bool, (rows,))
    if max_query_len < 1:
        raise AbiArgumentError(f"{op}: max_query_len must be >= 1, got {max_query_len}")
    return rows


def check_conv_args(conv_state, x, weight, bias, query_start, state_rows, fresh, max_query_len) -> None:
    """Metadata-only validation of ``helios::causal_conv_update`` (safe on fake tensors)."""
    if not isinstance(conv_state, torch.Tensor) or conv_state.dim() != 3 or not conv_state.is_floating_point():
        raise AbiArgumentError(f"{_CONV}: conv_state must be a float tensor [S, C, K - 1]")
    channels, taps = conv_state.shape[1], conv_state.shape[2] + 1
    check_tensor(_CONV, "x", x, conv_state.dtype, (None, channels))
    check_tensor(_CONV, "weight", weight, conv_state.dtype, (channels, taps))
    check_tensor(_CONV, "bias", bias, conv_state.dtype, (channels,))
    _check_rows(_CONV, query_start, state_rows, fresh, max_query_len)
    check_same_device(_CONV, dict(conv_state=conv_state, x=x, weight=weight, bias=bias, query_start=query_start,
                                  state_rows=state_rows, fresh=fresh))


def check_scan_args(ssm_state, x, dt, A, B, C, query_start, state_rows, fresh, max_query_len) -> None:
    """Metadata-only validation of ``helios::ssm_scan`` (safe on fake tensors)."""
    if not isinstance(ssm_state, torch.Tensor) or ssm_state.dim() != 4 or ssm_state.dtype != torch.float32:
        raise AbiArgumentError(f"{_SCAN}: ssm_state must be a float32 tensor [S, H, P, N]")
    _, heads, head_dim, state_size = ssm_state.shape
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise AbiArgumentError(f"{_SCAN}: x must be a float tensor [T, H, P]")
    check_tensor(_SCAN, "x", x, x.dtype, (None, heads, head_dim))
    check_tensor(_SCAN, "dt", dt, x.dtype, (x.shape[0], heads))
    check_tensor(_SCAN, "A", A, torch.float32, (heads,))
    check_tensor(_SCAN, "B", B, x.dtype, (x.shape[0], None, state_size))
    check_tensor(_SCAN, "C", C, x.dtype, tuple(B.shape))
    if B.shape[1] < 1 or heads % B.shape[1]:
        raise AbiArgumentError(f"{_SCAN}: {heads} heads are not a multiple of {B.shape[1]} groups")
    _check_rows(_SCAN, query_start, state_rows, fresh, max_query_len)
    check_same_device(_SCAN, dict(ssm_state=ssm_state, x=x, dt=dt, A=A, B=B, C=C, query_start=query_start,
                                  state_rows=state_rows, fresh=fresh))


class _Lanes:
    """Per-row bookkeeping shared by both ops: initial state, token gathers, final write-back."""

    def __init__(self, query_start: torch.Tensor, state_rows: torch.Tensor, fresh: torch.Tensor, num_tokens: int):
        self.start = query_start[:-1].to(torch.int64)
        self.length = (query_start[1:] - query_start[:-1]).to(torch.int64)
        self.active = state_rows >= 0
        self.reads = self.active & ~fresh
        self.rows = state_rows.clamp(min=0)
        self.num_tokens = num_tokens
        # Write-back lanes: an inactive lane repeats the first active lane (same index, same value),
        # so duplicate indices always carry identical values and the write needs no host sync.
        lane = torch.arange(state_rows.shape[0], device=state_rows.device)
        first = torch.argmax(self.active.to(torch.int32))
        self.writer = torch.where(self.active, lane, first)

    def initial(self, state: torch.Tensor) -> torch.Tensor:
        """Each lane's starting state (zeros for fresh and inactive lanes), float32 where state is."""
        gathered = state.index_select(0, self.rows)
        keep = self.reads.view(-1, *([1] * (state.dim() - 1)))
        return torch.where(keep, gathered, torch.zeros_like(gathered))

    def step(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token index clamped into range, mask) of each lane's j-th token."""
        valid = self.active & (j < self.length)
        token = (self.start + j).clamp(0, max(self.num_tokens - 1, 0))
        return token, valid

    def write_back(self, state: torch.Tensor, final: torch.Tensor, original: torch.Tensor) -> None:
        """state[row] = final for active lanes; inactive lanes rewrite a value already being written."""
        value = torch.where(self.active.view(-1, *([1] * (final.dim() - 1))), final, original)
        state.index_copy_(0, self.rows[self.writer], value[self.writer].to(state.dtype))


def _scatter(out: torch.Tensor, token: torch.Tensor, valid: torch.Tensor, value: torch.Tensor) -> None:
    """out[token] = value for valid lanes; invalid lanes go to the spare last row of `out`."""
    target = torch.where(valid, token, torch.full_like(token, out.shape[0] - 1))
    out.index_copy_(0, target, value.to(out.dtype))


@abi_op(_CONV, mutates_args=("conv_state",), schema=CAUSAL_CONV_UPDATE_SCHEMA)
def causal_conv_update(conv_state, x, weight, bias, query_start, state_rows, fresh, max_query_len) -> torch.Tensor:
    check_conv_args(conv_state, x, weight, bias, query_start, state_rows, fresh, max_query_len)
    lanes = _Lanes(query_start, state_rows, fresh, x.shape[0])
    original = conv_state.index_select(0, lanes.rows)
    window = lanes.initial(conv_state)  # [R, C, K - 1]
    out = torch.zeros((x.shape[0] + 1, x.shape[1]), dtype=x.dtype, device=x.device)
    for j in range(max_query_len):
        token, valid = lanes.step(j)
        full = torch.cat((window, x.index_select(0, token).unsqueeze(-1)), dim=-1)  # [R, C, K]
        _scatter(out, token, valid, (full * weight).sum(-1) + bias)
        window = torch.where(valid.view(-1, 1, 1), full[..., 1:], window)
    lanes.write_back(conv_state, window, original)
    return out[:-1]


@causal_conv_update.register_fake
def _conv_fake(conv_state, x, weight, bias, query_start, state_rows, fresh, max_query_len):
    check_conv_args(conv_state, x, weight, bias, query_start, state_rows, fresh, max_query_len)
    return x.new_empty(x.shape)


@abi_op(_SCAN, mutates_args=("ssm_state",), schema=SSM_SCAN_SCHEMA)
def ssm_scan(ssm_state, x, dt, A, B, C, query_start, state_rows, fresh, max_query_len) -> torch.Tensor:
    check_scan_args(ssm_state, x, dt, A, B, C, query_start, state_rows, fresh, max_query_len)
    lanes = _Lanes(query_start, state_rows, fresh, x.shape[0])
    heads, groups = ssm_state.shape[1], B.shape[1]
    original = ssm_state.index_select(0, lanes.rows)
    state = lanes.initial(ssm_state)  # [R, H, P, N] float32
    out = torch.zeros((x.shape[0] + 1, *x.shape[1:]), dtype=torch.float32, device=x.device)
    for j in range(max_query_len):
        token, valid = lanes.step(j)
        step_dt = dt.index_select(0, token).float()  # [R, H]
        step_b = B.index_select(0, token).float().repeat_interleave(heads // groups, dim=1)  # [R, H, N]
        step_c = C.index_select(0, token).float().repeat_interleave(heads // groups, dim=1)
        step_x = x.index_select(0, token).float()  # [R, H, P]
        decay = torch.exp(step_dt * A)[..., None, None]
        updated = state * decay + (step_dt[..., None] * step_x)[..., None] * step_b[:, :, None, :]
        _scatter(out, token, valid, (updated @ step_c[..., None]).squeeze(-1))
        state = torch.where(valid.view(-1, 1, 1, 1), updated, state)
    lanes.write_back(ssm_state, state, original)
    return out[:-1]


@ssm_scan.register_fake
def _scan_fake(ssm_state, x, dt, A, B, C, query_start, state_rows, fresh, max_query_len):
    check_scan_args(ssm_state, x, dt, A, B, C, query_start, state_rows, fresh, max_query_len)
    return x.new_empty(x.shape, dtype=torch.float32)
