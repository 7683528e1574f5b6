"""CPU bodies of ABI ops for programs whose calls were checked once: the same values, less host work.

A CPU program calls each ABI op's Python body directly (`helios.runtime.loading.cpu_programs`).
The registered bodies validate their arguments on every call (dtype, shape, device: metadata that
never changes between calls of one loaded program, whose inputs are the same tensors every call)
and recompute per call what every layer of a step shares. A CPU program runs its first call with
the registered bodies, then the ones here:

- `UNCHECKED` maps an op to a body without the argument checks, computing exactly what the
  registered body computes after them (the same torch ops on the same values, in-place forms where
  a fresh result was only consumed once, a product's operands swapped where IEEE products commute);
- step plans, built once per program call and shared by every layer that calls the op with the
  same step inputs: `helios.abi.paged_reference.plan_attention` for the attention ops, and
  `plan_rotary` / `plan_slots` here for ``helios::rotary_cache_write`` and ``helios::cache_write``
  (the signed sine the rotation multiplies, and the slots a write fills: whether any is padding is
  read on the host once per step instead of once per layer);
- `attention_planned`, `rotary_cache_write_planned`, `cache_write_planned`: the ops over a plan.

Rotation as a roll: ``rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)`` equals
``roll(x, h) * cat(-s1, s2)`` bit for bit (``(-x2) * s1`` and ``x2 * (-s1)`` are the same IEEE
product), one op instead of four. When q and k are adjacent heads of one row-major tensor (the
split of a fused qkv projection), they are rotated as one [T, Hq + Hkv, D] view.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from helios.abi.completion import record_columns
from helios.abi.paged_reference import AttentionPlan, attend
from helios.abi.sampling import NO_TOKEN, DrawParams, host_sample
from helios.abi.sampling_cpu import greedy_tokens_cpu

_FLOAT32 = torch.float32
_silu = torch._C._nn.silu
_gelu = torch._C._nn.gelu


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``helios::rms_norm`` (`helios.abi.fused.reference_rms_norm`) on checked arguments."""
    x32 = x if x.dtype == _FLOAT32 else x.to(_FLOAT32)
    normed = x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    if x.dtype != _FLOAT32:
        normed = normed.to(x.dtype)
    if weight.dtype == normed.dtype:
        return normed.mul_(weight)
    return weight * normed


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``helios::add_rms_norm`` on checked arguments."""
    summed = x + delta
    return summed, rms_norm(summed, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``helios::silu_mul`` on checked arguments: silu(gate) * up."""
    width = gate_up.shape[1] // 2
    return _silu(gate_up[:, :width]).mul_(gate_up[:, width:])


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``helios::gelu_tanh_mul`` on checked arguments: gelu(gate, approximate="tanh") * up."""
    width = gate_up.shape[1] // 2
    return _gelu(gate_up[:, :width], approximate="tanh").mul_(gate_up[:, width:])


class SlotPlan(NamedTuple):
    """A step's cache-write slots: `keep` (bool [T]) selects the written tokens when some slot is
    padding (negative); None when every token is written (then `slots` is the slot mapping)."""

    slots: torch.Tensor
    keep: torch.Tensor | None


def plan_slots(slot_mapping: torch.Tensor) -> SlotPlan:
    if slot_mapping.numel() and int(_host_min(slot_mapping)) >= 0:
        return SlotPlan(slot_mapping, None)
    keep = slot_mapping >= 0
    return SlotPlan(slot_mapping[keep], keep)


def _host_min(values: torch.Tensor):
    """The least value, through a numpy view of a CPU tensor (no torch call and host read)."""
    return values.numpy().min() if values.device.type == "cpu" else values.min()


def cache_write_planned(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        plan: SlotPlan) -> None:
    """``helios::cache_write`` (`helios.abi.attention.reference_cache_write`) over a slot plan."""
    if plan.keep is not None:
        k, v = k[plan.keep], v[plan.keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, plan.slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, plan.slots, v)


class RotaryPlan(NamedTuple):
    """A step's rotation factors (cos, and sin with its first half negated) and write slots."""

    cos: torch.Tensor
    signed_sin: torch.Tensor
    half: int
    slots: SlotPlan


def plan_rotary(cos: torch.Tensor, sin: torch.Tensor, slots: SlotPlan) -> RotaryPlan:
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return RotaryPlan(cos, signed, half, slots)


def _rotate(x: torch.Tensor, plan: RotaryPlan) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (`helios.abi.fused.apply_rotary`), bit for bit."""
    return x * plan.cos + x.roll(plan.half, -1) * plan.signed_sin


def rotary_cache_write_planned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, plan: RotaryPlan) -> torch.Tensor:
    """``helios::rotary_cache_write`` (`helios.abi.fused.rotary_cache_write`) over a step plan:
    rotates q and k, writes the rotated k and v; returns the rotated q, contiguous."""
    joined = _adjacent_heads(q, k)
    if joined is None:
        q, k = _rotate(q, plan), _rotate(k, plan)
    else:
        rotated = _rotate(joined, plan)
        q, k = rotated[:, :q.shape[1]].contiguous(), rotated[:, q.shape[1]:]
    cache_write_planned(k_cache, v_cache, k, v, plan.slots)
    return q


def _adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """[T, Hq + Hkv, D]: q's heads then k's as one view, when k's heads follow q's in memory
    (each row's heads contiguous); None otherwise."""
    if q.dtype != k.dtype or q.stride() != k.stride() or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        return None
    row, head, element = q.stride()
    if element != 1 or head != q.shape[2] or k.storage_offset() != q.storage_offset() + q.shape[1] * head:
        return None
    if q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr() or row < (q.shape[1] + k.shape[1]) * head:
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def attention_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan,
                      scale: float) -> torch.Tensor:
    """``helios::paged_attention`` (and ``_tuned``, whose splits the CPU ignores) over a step plan."""
    return attend(plan, q, k_cache, v_cache, scale)


def completion_record(slots, generations, submission, tokens, offered, accepted, emitted, consumed_end,
                      draft_lag):
    """``helios::completion_record`` on checked arguments."""
    return record_columns(slots, generations, submission, tokens, offered, accepted, emitted, consumed_end,
                          draft_lag)


def sample_rows(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_counts,
                output_counts, grammar_mask, mask_rows, rows: torch.Tensor) -> torch.Tensor:
    """``helios::sample``'s tokens (int64 [R]) in the rows where `rows` (bool [R]) is true, NO_TOKEN
    in the others, on checked arguments. A row's token does not depend on the other rows (the op
    is batch-invariant), so only the chosen rows are computed: a padding row's parameters (zeros:
    a repetition penalty of 0) no longer send the whole call down the float64 reference pipeline.
    A program whose every use of the op's tokens selects them with `rows` computes the same
    outputs with this body (`helios.runtime.loading.cpu_fast`)."""
    greedy = greedy_tokens_cpu(logits, temperature, penalties, grammar_mask, mask_rows, rows)
    if greedy is not None:  # no chosen row draws or is penalised: the float32 argmax (the same tokens)
        return _unchosen_cleared(greedy, rows)
    chosen = rows.tolist()
    params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
    counts = (prompt_counts, output_counts)
    if all(chosen):
        return host_sample(logits, params, penalties, counts, grammar_mask, mask_rows)
    tokens = torch.full_like(seeds, NO_TOKEN)
    if not any(chosen):
        return tokens
    index = torch.tensor([row for row, keep in enumerate(chosen) if keep], device=logits.device)
    picked = host_sample(logits[index], params.rows(index), penalties[index], (counts[0][index], counts[1][index]),
                         grammar_mask[index], mask_rows[index])
    return tokens.index_put_((index,), picked)


def sample_rows_gathering(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_table,
                          output_table, slots, grammar_mask, mask_rows, rows: torch.Tensor) -> torch.Tensor:
    """`sample_rows` whose count arguments are ``prompt_table[slots]`` and ``output_table[slots]``,
    gathered here only when a chosen row draws or is penalised: the greedy fast path never reads
    them, so a greedy step gathers no [R, V] count rows (the same tokens either way)."""
    greedy = greedy_tokens_cpu(logits, temperature, penalties, grammar_mask, mask_rows, rows)
    if greedy is not None:
        return _unchosen_cleared(greedy, rows)
    return sample_rows(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_table[slots],
                       output_table[slots], grammar_mask, mask_rows, rows)


def _unchosen_cleared(tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``tokens.masked_fill_(~rows, NO_TOKEN)`` for fresh contiguous CPU tokens, through numpy views."""
    tokens.numpy()[~rows.numpy()] = NO_TOKEN
    return tokens


UNCHECKED: dict[str, Callable] = {
    "helios::rms_norm": rms_norm,
    "helios::add_rms_norm": add_rms_norm,
    "helios::silu_mul": silu_mul,
    "helios::gelu_tanh_mul": gelu_tanh_mul,
    "helios::completion_record": completion_record,
}
