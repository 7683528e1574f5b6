"""The generic paged decoder forward: packed tokens in, final hidden states out.

Pure functions of an `Architecture`, the named weights of `weight_layout` and one packed step. They
are traced by `torch.export` (see `program.py`); attention and cache writes go through the ABI ops of
`helios.abi.attention`, so the only tensors they mutate are the cache planes, written in place.
The arithmetic mirrors the Hugging Face reference order (float32 norms, rotary on [cos, sin] halves)
so that float32 programs agree with it to rounding. A tensor-parallel Architecture (one rank's
share) combines partial results through the collectives of `helios.ignition.tensor_parallel`.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F

import helios.abi.attention  # noqa: F401  (registers helios::paged_attention(_tuned), helios::cache_write)
import helios.abi.attention_sinks  # noqa: F401  (registers helios::paged_attention_sinks(_tuned))
import helios.abi.attention_softcap  # noqa: F401  (registers helios::paged_attention_softcap(_tuned))
import helios.abi.attention_chunked  # noqa: F401  (registers helios::paged_attention_chunked)
import helios.abi.fused  # noqa: F401  (registers helios::rms_norm, add_rms_norm, silu_mul, rotary_cache_write)
import helios.abi.layer_norm  # noqa: F401  (registers helios::layer_norm)
import helios.abi.moe  # noqa: F401  (registers helios::moe_route, helios::moe_experts)
import helios.abi.moe_sparsemixer  # noqa: F401  (registers helios::moe_route_sparsemixer)
from helios.abi.fused import apply_rotary
from helios.abi.layer_norm import reference_layer_norm
from helios.ignition.activations import plain_activation
from helios.ignition.architecture import Architecture
from helios.ignition.tensor_parallel import (
    Partial, embed_tokens, partial_sum, residual_norm, row_parallel_linear, row_parallel_output, summed, vocab_logits,
)
from helios.ignition.window_split import layer_storage


class PackedStep(NamedTuple):
    """One step's packed geometry: R rows over T packed tokens (see `helios.abi.attention`)."""

    token_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    query_start: torch.Tensor  # int32 [R + 1]
    page_table: torch.Tensor  # int32 [R, max_pages]
    slot_mapping: torch.Tensor  # int64 [T], -1 for padding tokens
    splits: torch.Tensor | None = None  # int32 [1] tuned decode split count; None: untuned attention
    # Prompt programs (PREFILL, SCORED_PREFILL: few rows of many tokens): latent attention up-projects
    # the rows' context into per-head keys/values; every other step attends over the latents absorbed.
    up_project: bool = False
    # The sliding layers' own region (`helios.ignition.window_split.WindowStorage`); None: one region.
    window: object = None
    # [T, H] added to the token embeddings (an Engram core's projected n-gram rows); None: nothing.
    embedding_add: torch.Tensor | None = None
    # The token indexer's key planes and selection (`helios.ignition.sparse_latent.IndexStorage`); None: none.
    index: object = None


def slot_mapping(query_start: torch.Tensor, page_table: torch.Tensor, positions: torch.Tensor, page_tokens: int):
    """Flat cache slot of every packed token through its row's page table; -1 for padding tokens.

    A packed token's position must lie inside its row's page table (paged_attention rejects it
    otherwise); the clamp only keeps padding tokens' lookups in range.
    """
    num_tokens, num_rows = positions.shape[0], page_table.shape[0]
    token_index = torch.arange(num_tokens, device=positions.device, dtype=query_start.dtype)
    rows = torch.searchsorted(query_start[1:].contiguous(), token_index, right=True)
    is_packed = token_index < query_start[num_rows]
    rows = rows.clamp(max=num_rows - 1)
    page_index = torch.div(positions, page_tokens, rounding_mode="floor").clamp(0, page_table.shape[1] - 1)
    pages = page_table[rows, page_index].to(torch.int64)
    slots = pages * page_tokens + torch.remainder(positions, page_tokens)
    return torch.where(is_packed, slots, torch.full_like(slots, -1))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face RMSNorm over the last dimension (one fused ABI op; see `helios.abi.fused`)."""
    return torch.ops.helios.rms_norm(x, weight, eps)


def block_norm(arch: Architecture, w: Mapping[str, torch.Tensor], x: torch.Tensor, slot: str) -> torch.Tensor:
    """`x` normed by the `slot` norm: RMSNorm, or under ``arch.layer_norm`` ``helios::layer_norm``
    (with the ``<slot>_bias`` bias under ``arch.norm_bias``)."""
    if arch.layer_norm:
        return torch.ops.helios.layer_norm(x, w[slot], w.get(slot + "_bias"), arch.rms_norm_eps)
    return rms_norm(x, w[slot], arch.rms_norm_eps)


def head_norm(arch: Architecture, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """q or k [T, heads, D] normed per head by its q/k norm: RMSNorm of one weight [D], or under
    ``arch.layer_norm`` a LayerNorm, whose weights under ``arch.qk_norm_heads`` are one row per head
    ([heads * D], Cohere's; the op takes one [D] row, so those are its arithmetic in torch ops)."""
    if not arch.layer_norm:
        return rms_norm(x, weight, arch.rms_norm_eps)
    if arch.qk_norm_heads:
        return reference_layer_norm(x, weight.reshape(x.shape[1], x.shape[2]), None, arch.rms_norm_eps)
    return torch.ops.helios.layer_norm(x, weight, None, arch.rms_norm_eps)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, factor: float = 1.0):
    """cos and sin [T, 1, D] for the packed positions, the rotated pairs' times `factor` (a rope
    scaling's attention factor). A zero frequency marks a pass-through pair of a partially rotated
    head (`helios.ignition.recipes.moe.partial_rotary`): the reference leaves it unscaled, so it keeps
    cos 1 and sin 0."""
    freqs = positions[:, None].to(torch.float32) * inv_freq[None, :].to(torch.float32)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if factor != 1.0:
        both = torch.cat((inv_freq, inv_freq)).to(torch.float32)
        scale = torch.where(both == 0, torch.ones_like(both), torch.full_like(both, factor))
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def layer_rotary(arch: Architecture, layer: int, cos: torch.Tensor, sin: torch.Tensor):
    """The cos/sin tables `layer` rotates with: the step's, or for a NoPE layer (`arch.nope_layers`)
    cos 1 and sin 0, which leave queries and keys exactly as projected (the same ops and rewrites
    as every other layer; only NoPE layers add the two fills)."""
    if arch.is_rotary(layer):
        return cos, sin
    return torch.ones_like(cos), torch.zeros_like(sin)


class LayerInputs(NamedTuple):
    """What every layer of one step shares: the packed geometry, the cache storage, rotary tables."""

    step: PackedStep
    k_cache: torch.Tensor  # [layers, pages, page_tokens, Hkv, D], written in place
    v_cache: torch.Tensor
    cos: torch.Tensor  # [T, 1, D]
    sin: torch.Tensor
    local: tuple | None = None  # (cos, sin) of rope.local_inv_freq for `arch.local_rope_layers`, else None


def layer_inputs(arch: Architecture, w: Mapping[str, torch.Tensor], step: PackedStep, k_cache, v_cache,
                 dtype: torch.dtype) -> LayerInputs:
    """The step's shared layer inputs: the rotary tables of ``rope.inv_freq`` and, where some layers
    rotate with ``rope.local_inv_freq`` (Gemma's sliding layers), that table's too (no attention
    factor: the reference's local rope is unscaled)."""
    cos, sin = rotary_tables(step.positions, w["rope.inv_freq"], dtype, arch.rope_attention_factor)
    local = rotary_tables(step.positions, w["rope.local_inv_freq"], dtype) if arch.local_rope_layers else None
    return LayerInputs(step, k_cache, v_cache, cos, sin, local)


def layer_tables(arch: Architecture, layer: int, shared: LayerInputs):
    """The cos/sin tables `layer` rotates with (`layer_rotary`, or the local ones)."""
    if layer in arch.local_rope_layers:
        return shared.local
    return layer_rotary(arch, layer, shared.cos, shared.sin)


def attention_block(arch: Architecture, w: Mapping[str, torch.Tensor], layer: int, hidden, shared: LayerInputs,
                    partial: bool = False, rows: torch.Tensor | None = None):
    """Self-attention of one layer; writes this step's keys/values into the layer's cache planes.
    With `partial`, a tensor-parallel rank may return its unsummed `Partial` output (for
    `residual_norm`). With `rows` (packed token indices), the output projection runs on those
    tokens' attention outputs only, and the result has one row each (every token's keys and values
    are still written)."""
    out = row_parallel_output if partial else row_parallel_linear
    prefix, num_tokens = f"layers.{layer}.", hidden.shape[0]
    if arch.latent is not None:  # multi-head latent attention: its planes hold latents and rotary keys
        from helios.ignition.latent import latent_attention  # (it builds on this module's norms and rotary)

        attended = latent_attention(arch, w, layer, hidden, shared)
        return out(arch, attended if rows is None else attended[rows], w[prefix + "o.weight"], None)
    qkv = F.linear(hidden, w[prefix + "qkv.weight"], w.get(prefix + "qkv.bias"))
    if arch.qkv_clip:  # DBRX: q, k and v clamped elementwise (each rank its rows alike)
        qkv = qkv.clamp(-arch.qkv_clip, arch.qkv_clip)
    if arch.attention_gate:  # AFMoE: output-gate rows after q, k and v
        q, k, v, gate = qkv.split([arch.q_size, arch.kv_size, arch.kv_size, arch.q_size], dim=-1)
    else:
        q, k, v = qkv.split([arch.q_size, arch.kv_size, arch.kv_size], dim=-1)
    if arch.qk_norm_whole:  # OLMo 2: one norm over each whole projection, before the heads are split
        q, k = projection_norm(arch, q, w[prefix + "q_norm"]), projection_norm(arch, k, w[prefix + "k_norm"])
    q = q.reshape(num_tokens, arch.num_heads, arch.head_dim)
    k = k.reshape(num_tokens, arch.num_kv_heads, arch.head_dim)
    v = v.reshape(num_tokens, arch.num_kv_heads, arch.head_dim)
    if arch.is_qk_normed(layer) and not (arch.qk_norm_after_rotary or arch.qk_norm_whole):
        q, k = head_norm(arch, q, w[prefix + "q_norm"]), head_norm(arch, k, w[prefix + "k_norm"])
    step = shared.step
    k_plane, v_plane, table, slots = layer_storage(arch, layer, shared.k_cache, shared.v_cache, step, step.window)
    cos, sin = layer_tables(arch, layer, shared)
    if arch.qk_norm_after_rotary and arch.is_qk_normed(layer):
        q, k, cos, sin = normed_after_rotary(arch, w, prefix, q, k, cos, sin)
    temperature = arch.query_temperature
    if temperature is not None and layer in temperature.layers:  # Llama 4: per position, after the q norm
        q = (q * temperature.factors(step.positions)[:, None, None]).to(q.dtype)
    q = torch.ops.helios.rotary_cache_write(q, k, v, cos, sin, k_plane, v_plane, slots)
    attended = paged_attention(arch, w.get(prefix + "sinks"), layer, q, k_plane, v_plane,
                               step if table is step.page_table else step._replace(page_table=table))
    attended = attended.reshape(num_tokens, arch.q_size)
    if arch.attention_gate:  # each attended channel times sigmoid of its gate row, before o
        attended = attended * torch.sigmoid(gate)
    if arch.attention_experts:  # JetMoE: each expert's heads times the token's routing weight for that expert
        attended = attended * expert_head_weights(arch, w[prefix + "attn_router.weight"], hidden).to(attended.dtype)
    if rows is not None:
        attended = attended[rows]
    return out(arch, attended, w[prefix + "o.weight"], w.get(prefix + "o.bias"))


def expert_head_weights(arch: Architecture, router: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """[T, q_size] weights of the attended channels under ``arch.attention_experts``: per token, the
    softmax over its top-k router logits for the chosen experts' heads, 0 for the others (head j * E + e
    belongs to expert e; a tensor-parallel rank holds whole key/value groups, so the layout is the same)."""
    logits = F.linear(hidden.to(torch.float32), router)
    weights, ids = torch.ops.helios.moe_route(logits, None, "topk_softmax", arch.attention_experts_per_token, 1, 1,
                                              True, 1.0)
    dense = torch.zeros_like(logits).scatter(1, ids.long(), weights.to(logits.dtype))  # [T, E]
    per_head = dense[:, None, :, None].expand(-1, arch.num_kv_heads, -1, arch.head_dim)
    return per_head.reshape(hidden.shape[0], arch.q_size)


def projection_norm(arch: Architecture, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMS norm of a whole q or k projection [T, heads * D] (``arch.qk_norm_whole``). Under tensor
    parallelism a rank holds its heads' share of the row: the squares are summed over the ranks (one
    all-reduce of [T, 1]) and the mean taken over the whole width (the reference's statistic)."""
    if arch.tensor_parallel == 1:
        return rms_norm(x, weight, arch.rms_norm_eps)
    x32 = x.to(torch.float32)
    squares = partial_sum(arch, x32.pow(2).sum(-1, keepdim=True))
    variance = squares / (x.shape[-1] * arch.tensor_parallel)
    return weight * (x32 * torch.rsqrt(variance + arch.rms_norm_eps)).to(x.dtype)


def normed_after_rotary(arch: Architecture, w: Mapping[str, torch.Tensor], prefix: str, q, k, cos, sin):
    """(q, k, cos, sin) where the q/k norms follow the rotation (`arch.qk_norm_after_rotary`,
    HunYuan's order): q and k rotated, then normed per head, and cos 1 / sin 0 for the cache write,
    which then rotates nothing (the same write and rewrites as every other layer)."""
    q = rms_norm(apply_rotary(q, cos, sin), w[prefix + "q_norm"], arch.rms_norm_eps)
    k = rms_norm(apply_rotary(k, cos, sin), w[prefix + "k_norm"], arch.rms_norm_eps)
    return q, k, torch.ones_like(cos), torch.zeros_like(sin)


def paged_attention(arch: Architecture, sinks, layer: int, q, k_plane, v_plane, step: PackedStep):
    """The layer's attention op: with or without sinks, soft-capped (``arch.attention_softcap``) or
    not, tuned (device split count) or not; a chunked layer's (``arch.layer_chunks``) untuned."""
    geometry = (q, k_plane, v_plane, step.page_table, step.query_start, step.positions,
                arch.attention_scale, arch.layer_windows[layer])
    ops = torch.ops.helios
    if arch.layer_chunk(layer):  # chunked local attention (never with sinks or a cap: the Architecture refuses)
        return ops.paged_attention_chunked(*geometry, arch.layer_chunk(layer))
    if arch.attention_softcap:  # (never with sinks: the Architecture refuses the pair)
        if step.splits is None:
            return ops.paged_attention_softcap(*geometry, arch.attention_softcap)
        return ops.paged_attention_softcap_tuned(*geometry, arch.attention_softcap, step.splits)
    if sinks is None:
        return ops.paged_attention(*geometry) if step.splits is None else ops.paged_attention_tuned(*geometry,
                                                                                                      step.splits)
    if step.splits is None:
        return ops.paged_attention_sinks(*geometry, sinks)
    return ops.paged_attention_sinks_tuned(*geometry, sinks, step.splits)


def mlp_block(arch: Architecture, w: Mapping[str, torch.Tensor], prefix: str, hidden: torch.Tensor,
              partial: bool = False):
    """The layer's MLP: the gated MLP, or the mixture of experts where the layer is sparse. With
    `partial`, a tensor-parallel rank may return its unsummed `Partial` output."""
    if arch.is_sparse(int(prefix.split(".")[1])):
        out = moe_block(arch, w, prefix, hidden)
        return out if partial else summed(arch, out)
    if not arch.gated_mlp:  # StarCoder2: down(act(up(x)))
        up = F.linear(hidden, w[prefix + "up.weight"], w.get(prefix + "up.bias"))
        out = row_parallel_output if partial else row_parallel_linear
        acted = plain_activation(arch.mlp_activation, up, w.get(prefix + "mlp_act"))
        return out(arch, acted, w[prefix + "down.weight"], w.get(prefix + "down.bias"))
    gate_up = F.linear(hidden, w[prefix + "gate_up.weight"], w.get(prefix + "gate_up.bias"))
    out = row_parallel_output if partial else row_parallel_linear
    return out(arch, gated_activation(arch, gate_up), w[prefix + "down.weight"], w.get(prefix + "down.bias"))


def gated_activation(arch: Architecture, gate_up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up of a gate/up product: ``helios::silu_mul`` or ``helios::gelu_tanh_mul``."""
    if arch.mlp_activation == "gelu_tanh":
        return torch.ops.helios.gelu_tanh_mul(gate_up)
    return torch.ops.helios.silu_mul(gate_up)


def parallel_block(arch: Architecture, w: Mapping[str, torch.Tensor], layer: int, normed, shared: LayerInputs,
                   rows: torch.Tensor | None = None, hidden: torch.Tensor | None = None):
    """(delta, bias): a parallel layer's residual delta (``arch.parallel_block``), its attention plus
    its MLP of the same normed input (with `rows`, of those tokens: `attention_block`'s), or under
    ``arch.parallel_mlp_norm`` its MLP of the layer's input `hidden` normed by ``post_norm``. Under tensor
    parallelism the delta is the rank's `Partial`, both products added on the rank so that one
    all-reduce sums them (`residual_update`), and `bias` the o and down biases to add once (None
    without them); on one rank `bias` is None and the delta the whole sum."""
    prefix = f"layers.{layer}."
    mlp_input = block_norm(arch, w, hidden, prefix + "post_norm") if arch.parallel_mlp_norm else normed
    mlp_input = mlp_input if rows is None else mlp_input[rows]
    if arch.tensor_parallel == 1:
        attended = attention_block(arch, w, layer, normed, shared, rows=rows)
        return attended + mlp_block(arch, w, prefix, mlp_input), None
    names = (prefix + "o.bias", prefix + "down.bias")
    unbiased = {name: tensor for name, tensor in w.items() if name not in names}
    attended = attention_block(arch, unbiased, layer, normed, shared, partial=True, rows=rows)
    mixed = mlp_block(arch, unbiased, prefix, mlp_input, partial=True)
    biases = [w[name] for name in names if name in w]
    return Partial(attended.value + mixed.value), (sum(biases[1:], biases[0]) if biases else None)


def sandwiched(arch: Architecture, w: Mapping[str, torch.Tensor], slot: str, delta):
    """A block's output as the residual add takes it: `delta` itself, or under ``sandwich_norms``
    its sum over ranks normed by `slot` (Gemma's post-attention and post-feedforward norms)."""
    if not arch.sandwich_norms:
        return delta
    return rms_norm(summed(arch, delta), w[slot], arch.rms_norm_eps)


def moe_block(arch: Architecture, w: Mapping[str, torch.Tensor], prefix: str, hidden: torch.Tensor):
    """Routed experts (plus the shared expert): float32 router logits, `helios::moe_route`, then
    `helios::moe_experts`; under tensor parallelism every rank routes alike (the router is whole)
    and holds each expert's share of its width, so one all-reduce sums experts and shared expert:
    the rank's `Partial` output is returned (`summed` or `residual_norm` adds it up)."""
    moe = arch.moe
    logits = F.linear(hidden.to(torch.float32), w[prefix + "router.weight"], w.get(prefix + "router.bias"))
    if moe.scoring == "sparsemixer":  # PhiMoE: its own op (a threshold argument moe_route has no slot for)
        weights, ids = torch.ops.helios.moe_route_sparsemixer(logits, moe.jitter_eps)
    else:
        weights, ids = torch.ops.helios.moe_route(
            logits, w.get(prefix + "router.correction_bias"), moe.scoring, moe.experts_per_token, moe.num_groups,
            moe.topk_groups, moe.normalize, moe.scale)
    first = prefix + ("experts.gate_up" if moe.is_gated else "experts.up")  # non-gated: the up rows alone
    experts = (w[first], w.get(first + "_bias"), w[prefix + "experts.down"],
               w.get(prefix + "experts.down_bias"), moe.activation, moe.alpha, moe.limit)
    if moe.input_weighted:  # Llama 4: expert_k(w_k x), one call per choice (each scales the input its own way)
        ones = torch.ones_like(weights[:, :1])
        outs = [torch.ops.helios.moe_experts((hidden * weights[:, k:k + 1]).to(hidden.dtype), ones, ids[:, k:k + 1],
                                             *experts) for k in range(moe.experts_per_token)]
        out = outs[0] if len(outs) == 1 else torch.stack(outs).sum(0)
    elif moe.latent_size:  # Nemotron-H: experts in a latent (linear both ways: a rank's share sums as it is)
        latent = F.linear(hidden, w[prefix + "latent_in.weight"])
        out = F.linear(torch.ops.helios.moe_experts(latent, weights, ids, *experts), w[prefix + "latent_out.weight"])
    else:
        out = torch.ops.helios.moe_experts(hidden, weights, ids, *experts)
    if moe.shared_intermediate_size:
        if moe.is_gated:
            shared = gated_activation(arch, F.linear(hidden, w[prefix + "shared.gate_up.weight"]))
        else:  # the non-gated shared expert, of the MLP's activation
            shared = plain_activation(arch.mlp_activation, F.linear(hidden, w[prefix + "shared.up.weight"]))
        shared = F.linear(shared, w[prefix + "shared.down.weight"])
        if moe.shared_gate:  # Qwen2-MoE: per token, sigmoid of the whole input (each rank: the same scalar)
            shared = shared * torch.sigmoid(F.linear(hidden, w[prefix + "shared.gate"]))
        out = out + shared
    return Partial(out) if arch.tensor_parallel > 1 else out


def decoder_hidden(arch, w, k_cache, v_cache, step: PackedStep, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Final-normed hidden states [T, H] of the packed tokens. Mutates k_cache/v_cache in place.

    With `rows` (packed token indices, [N]): the states [N, H] of those tokens alone. The last layer
    then runs its output projection and MLP on them only, after its attention over every token (which
    writes every token's keys and values): a prompt chunk samples from its last token, so the rest
    of the chunk needs nothing past the last layer's cache write."""
    hidden = embed_tokens(arch, w["embed"], w.get("vocab.start"), step.token_ids)
    if step.embedding_add is not None:
        hidden = hidden + step.embedding_add.to(hidden.dtype)
    if arch.embedding_norm:  # NanoChat: the residual stream starts from the normed embeddings
        hidden = rms_norm(hidden, w["embed_norm"], arch.rms_norm_eps)
    shared = layer_inputs(arch, w, step, k_cache, v_cache, hidden.dtype)
    normed = block_norm(arch, w, hidden, "layers.0.input_norm") if arch.pre_norms else hidden
    for layer in range(arch.num_layers):
        prefix = f"layers.{layer}."
        kept = rows if layer == arch.num_layers - 1 else None
        next_norm = f"layers.{layer + 1}.input_norm" if layer + 1 < arch.num_layers else "final_norm"
        # The residual add and the next norm, one fused op (with the sum over ranks of a Partial).
        if arch.parallel_block:  # Cohere: attention and MLP of one normed input, added at once
            delta, bias = parallel_block(arch, w, layer, normed, shared, kept, hidden)
            hidden = hidden if kept is None else hidden[kept]
            hidden, normed = residual_update(arch, w, hidden if bias is None else hidden + bias, delta, next_norm)
            continue
        attended = attention_block(arch, w, layer, normed, shared, partial=True, rows=kept)
        if kept is not None:
            hidden = hidden[kept]
        attended = sandwiched(arch, w, prefix + "attn_out_norm", attended)
        hidden, normed = residual_update(arch, w, hidden, attended, prefix + "post_norm")
        mixed = sandwiched(arch, w, prefix + "mlp_out_norm", mlp_block(arch, w, prefix, normed, partial=True))
        hidden, normed = residual_update(arch, w, hidden, mixed, next_norm)
    return normed


def residual_update(arch: Architecture, w: Mapping[str, torch.Tensor], hidden: torch.Tensor, delta, slot: str):
    """(hidden + delta, the next block's input): the sum normed by the `slot` norm (`residual_norm`,
    one fused op), or without ``pre_norms`` (OLMo 2) the sum itself, only the final norm applied.
    Under ``layer_norm`` the sum (over ranks too) is added, then normed by ``helios::layer_norm``."""
    if arch.layer_norm:
        hidden = hidden + summed(arch, delta)
        return hidden, block_norm(arch, w, hidden, slot)
    if arch.pre_norms or slot == "final_norm":
        return residual_norm(arch, hidden, delta, w[slot], arch.rms_norm_eps)
    hidden = hidden + summed(arch, delta)
    return hidden, hidden


def lm_logits(arch: Architecture, w: Mapping[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits [N, V] of hidden states [N, H] (the embedding matrix when embeddings are tied)."""
    head = w["embed"] if arch.tie_word_embeddings else w["lm_head"]
    return vocab_logits(arch, hidden, head, w.get("lm_head_bias"))
