"""The draft model inside captured programs: weight binding, one-token steps and history writes.

A core with a draft model keeps the draft's own paged key/value planes, addressed through its own
page-table view with the same page ids as the target's (page offset 0: the draft attends at the
target's positions and never writes past a lane's reserved ceiling). Every program of such a core
writes the draft's keys/values for exactly the tokens it consumes, so the draft context covers the
committed history after any program; speculative programs additionally write the positions of
their proposals, which later rounds overwrite.

Nothing here allocates persistent state or reads host values; mutation is limited to the draft
planes passed in, through ``helios::cache_write``.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from helios.ignition.architecture import Architecture
from helios.ignition.decoder import (
    PackedStep,
    apply_rotary,
    attention_block,
    block_norm,
    decoder_hidden,
    head_norm,
    layer_inputs,
    layer_tables,
    lm_logits,
    mlp_block,
    parallel_block,
    projection_norm,
    rms_norm,
    sandwiched,
    slot_mapping,
)
from helios.ignition.program_spec import DRAFT_PREFIX
from helios.ignition.tensor_parallel import embed_tokens, summed


class DraftStorage(NamedTuple):
    """The draft's planes and the page-table rows of the submitted lanes."""

    k_cache: torch.Tensor  # [draft layers, pages, page_tokens, Hkv, D], written in place
    v_cache: torch.Tensor
    table_rows: torch.Tensor  # int32 [rows, max_pages]


def split_weights(names: Sequence[str], weights: list[torch.Tensor]):
    """(target weights, draft weights) by name; the draft's names lose `DRAFT_PREFIX`."""
    if len(weights) != len(names):
        raise ValueError(f"expected {len(names)} weights, got {len(weights)}")
    target, draft = {}, {}
    for name, tensor in zip(names, weights):
        if name.startswith(DRAFT_PREFIX):
            draft[name[len(DRAFT_PREFIX):]] = tensor
        else:
            target[name] = tensor
    return target, draft


def retable(step: PackedStep, table_rows: torch.Tensor, page_tokens: int) -> PackedStep:
    """`step` addressed through another page-table view of the same rows (its slots recomputed)."""
    slots = slot_mapping(step.query_start, table_rows, step.positions, page_tokens)
    return step._replace(page_table=table_rows, slot_mapping=torch.where(step.slot_mapping >= 0, slots, -1))


def write_history(draft: Architecture, weights, storage: DraftStorage, step: PackedStep, page_tokens: int) -> None:
    """Writes the draft's keys/values of every packed token of `step` (its output is not needed)."""
    write_keys(draft, weights, storage, retable(step, storage.table_rows, page_tokens))


def write_keys(arch: Architecture, w, storage: DraftStorage, step: PackedStep) -> None:
    """The decoder's cache writes without its output: every layer but the last runs whole, the last
    one only projects, rotates and writes its keys/values (no attention, MLP or final norm)."""
    hidden = embed_tokens(arch, w["embed"], w.get("vocab.start"), step.token_ids)
    shared = layer_inputs(arch, w, step, storage.k_cache, storage.v_cache, hidden.dtype)
    last = arch.num_layers - 1
    for layer in range(last):
        prefix = f"layers.{layer}."
        normed = _block_input(arch, w, hidden, prefix + "input_norm")
        if arch.parallel_block:  # Cohere: attention and MLP read the same normed input
            delta, bias = parallel_block(arch, w, layer, normed, shared, hidden=hidden)
            hidden = hidden + summed(arch, delta)
            hidden = hidden if bias is None else hidden + bias
            continue
        hidden = hidden + sandwiched(arch, w, prefix + "attn_out_norm", attention_block(arch, w, layer, normed, shared))
        normed = _block_input(arch, w, hidden, prefix + "post_norm")
        hidden = hidden + sandwiched(arch, w, prefix + "mlp_out_norm", mlp_block(arch, w, prefix, normed))
    prefix = f"layers.{last}."
    normed = _block_input(arch, w, hidden, prefix + "input_norm")
    if arch.latent is not None:
        from helios.ignition.latent import latent_keys  # (it builds on the decoder's norms and rotary)

        latent_keys(arch, w, last, normed, shared)
        return
    bias = w.get(prefix + "qkv.bias")
    rows = slice(arch.q_size, arch.q_size + 2 * arch.kv_size)  # (not AFMoE's output-gate rows after them)
    kv = F.linear(normed, w[prefix + "qkv.weight"][rows], None if bias is None else bias[rows])
    if arch.qkv_clip:  # DBRX: elementwise, so clamping the k/v rows alone is the decoder's clamp
        kv = kv.clamp(-arch.qkv_clip, arch.qkv_clip)
    if arch.qk_norm_whole:  # OLMo 2: the whole key projection normed before the heads are split
        kv = torch.cat((projection_norm(arch, kv[:, :arch.kv_size], w[prefix + "k_norm"]), kv[:, arch.kv_size:]), 1)
    k, v = kv.reshape(-1, 2 * arch.num_kv_heads, arch.head_dim).split(arch.num_kv_heads, dim=1)
    cos, sin = layer_tables(arch, last, shared)
    if arch.qk_norm_after_rotary and arch.is_qk_normed(last):  # HunYuan's order: rotate, then norm
        k = rms_norm(apply_rotary(k, cos, sin), w[prefix + "k_norm"], arch.rms_norm_eps)
    else:
        if arch.is_qk_normed(last) and not arch.qk_norm_whole:  # (not Llama 4's un-normed layers)
            k = head_norm(arch, k, w[prefix + "k_norm"])
        k = apply_rotary(k, cos, sin)
    torch.ops.helios.cache_write(storage.k_cache[last], storage.v_cache[last], k.contiguous(), v.contiguous(),
                                 step.slot_mapping)


def _block_input(arch: Architecture, w, hidden: torch.Tensor, slot: str) -> torch.Tensor:
    """A block's input: the residual stream normed by `slot`, or as it is without ``pre_norms``."""
    return block_norm(arch, w, hidden, slot) if arch.pre_norms else hidden


def one_token_step(tokens, positions, table_rows, writable, page_tokens: int) -> PackedStep:
    """One token per lane at `positions`; lanes that are not `writable` write nothing.

    A lane that does not write attends at position 0 instead (its output is never used), so no
    position outside a lane's reserved pages is ever looked up.
    """
    rows = tokens.shape[0]
    query_start = torch.arange(rows + 1, dtype=torch.int32, device=tokens.device)
    positions = torch.where(writable, positions, torch.zeros_like(positions))
    slots = slot_mapping(query_start, table_rows, positions, page_tokens)
    return PackedStep(tokens, positions, query_start, table_rows, torch.where(writable, slots, -1))


def step_logits(draft: Architecture, weights, storage: DraftStorage, step: PackedStep) -> torch.Tensor:
    """float32 draft logits [rows, V] of a one-token-per-lane step (writes its keys/values)."""
    hidden = decoder_hidden(draft, weights, storage.k_cache, storage.v_cache, step)
    return lm_logits(draft, weights, hidden)
