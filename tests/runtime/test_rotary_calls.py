"""`helios.runtime.loading.rotary_calls`: each layer's rotary cache write and attention over its planes
become one ``helios::rotary_paged_attention`` call (every attention variant), the exported module's
outputs and cache writes unchanged bit for bit; pairs whose rotated q has another user stay; the
inverse rewrite restores the pair."""

from __future__ import annotations

import torch

import helios.abi.attention  # noqa: F401 (registers the ops)
import helios.abi.attention_chunked  # noqa: F401
import helios.abi.attention_sinks  # noqa: F401
import helios.abi.fused  # noqa: F401
import helios.abi.rotary_attention  # noqa: F401
from helios.runtime.loading import rotary_calls
from helios.runtime.loading.rotary_calls import (
    fuse_rotary_attention, prefetch_output_weights, rotary_module, split_rotary_attention,
)

OPS = torch.ops.helios
HEADS, KV_HEADS, DIM, PAGE_TOKENS, ROWS = 4, 2, 8, 4, 3
ATTENTION = [OPS.paged_attention.default, OPS.paged_attention_tuned.default, OPS.paged_attention_sinks.default,
             OPS.paged_attention_sinks_tuned.default]


class _Layers(torch.nn.Module):
    """One layer per attention variant (plain, tuned, sinks, sinks tuned); with `extra_user`, the last
    layer's rotated q is also added to the output (that pair must not fuse)."""

    def __init__(self, extra_user: bool = False):
        super().__init__()
        self.extra_user = extra_user

    def forward(self, qkv, cos, sin, k_cache, v_cache, slots, page_table, starts, positions, sinks, splits):
        outs = []
        for layer, variant in enumerate(ATTENTION):
            q, k, v = (qkv[layer] * (layer + 1)).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
            q = OPS.rotary_cache_write(q.reshape(ROWS, HEADS, DIM), k.reshape(ROWS, KV_HEADS, DIM),
                                       v.reshape(ROWS, KV_HEADS, DIM), cos, sin, k_cache[layer], v_cache[layer], slots)
            extra = (sinks,) if layer >= 2 else ()
            extra += (splits,) if layer % 2 else ()
            outs.append(variant(q, k_cache[layer], v_cache[layer], page_table, starts, positions, 0.35, 0, *extra))
        if self.extra_user:
            outs.append(q)
        return torch.stack(outs)


def _inputs():
    generator = torch.Generator().manual_seed(3)
    layers = len(ATTENTION)
    positions = torch.tensor([5, 2, 9])
    angles = positions[:, None].float() * torch.rand(DIM // 2, generator=generator)
    angles = torch.cat([angles, angles], -1)
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32)
    slots = table[torch.arange(ROWS), positions // PAGE_TOKENS].long() * PAGE_TOKENS + positions % PAGE_TOKENS
    cache = torch.randn(layers, 12, PAGE_TOKENS, KV_HEADS, DIM, generator=generator)
    return [torch.randn(layers, ROWS, (HEADS + 2 * KV_HEADS) * DIM, generator=generator), angles.cos()[:, None],
            angles.sin()[:, None], cache, cache.clone() + 1, slots, table,
            torch.arange(ROWS + 1, dtype=torch.int32), positions, torch.randn(HEADS, generator=generator),
            torch.tensor([2], dtype=torch.int32)]


def _exported(extra_user: bool = False) -> torch.fx.GraphModule:
    return torch.export.export(_Layers(extra_user), tuple(_inputs()), strict=False).module()


def _targets(module) -> list:
    return [node.target for node in module.graph.nodes if node.op == "call_function"]


def _run(module):
    inputs = _inputs()
    return module(*inputs), inputs[3], inputs[4]


def test_every_variant_fuses_and_computes_the_same():
    exported = _exported()
    fused = rotary_module(exported, enabled=True)
    targets = _targets(fused)
    assert targets.count(OPS.rotary_paged_attention.default) == len(ATTENTION)
    assert OPS.rotary_cache_write.default not in targets and not set(ATTENTION) & set(targets)
    for got, expected in zip(_run(fused), _run(exported)):
        assert torch.equal(got, expected)
    assert _targets(exported).count(OPS.rotary_cache_write.default) == len(ATTENTION)  # the original untouched


def test_a_rotated_q_with_another_user_keeps_its_pair():
    exported = _exported(extra_user=True)
    fused = rotary_module(exported, enabled=True)
    targets = _targets(fused)
    assert targets.count(OPS.rotary_paged_attention.default) == len(ATTENTION) - 1
    assert targets.count(OPS.rotary_cache_write.default) == 1
    for got, expected in zip(_run(fused), _run(exported)):
        assert torch.equal(got, expected)


def test_the_inverse_rewrite_restores_each_pair():
    fused = rotary_module(_exported(), enabled=True)
    graph = fused.graph
    assert split_rotary_attention(graph) == len(ATTENTION)
    restored = torch.fx.GraphModule(fused, graph)
    targets = _targets(restored)
    assert [t for t in targets if t in ATTENTION] == ATTENTION
    assert targets.count(OPS.rotary_cache_write.default) == len(ATTENTION)
    for got, expected in zip(_run(restored), _run(_exported())):
        assert torch.equal(got, expected)
    assert fuse_rotary_attention(restored.graph) == len(ATTENTION)


def test_modules_without_a_pair_are_returned_as_they_are():
    module = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), strict=False).module()
    assert rotary_module(module, enabled=True) is module


class _WithChunked(_Layers):
    """The four fusable layers, then a layer of chunked attention (Llama 4's local layers)."""

    def forward(self, qkv, cos, sin, k_cache, v_cache, slots, page_table, starts, positions, sinks, splits):
        outs = super().forward(qkv, cos, sin, k_cache, v_cache, slots, page_table, starts, positions, sinks, splits)
        q = qkv[0, :, :HEADS * DIM].reshape(ROWS, HEADS, DIM)
        chunked = OPS.paged_attention_chunked(q, k_cache[0], v_cache[0], page_table, starts, positions, 0.35, 0, 4)
        return torch.cat([outs, chunked[None]])


def test_programs_with_chunked_attention_fuse_their_pairs_unless_switched_off(monkeypatch):
    """Llama 4's programs fuse their other pairs as any program does; `rotary_calls.FUSE_WITH_CHUNKED`
    off keeps them unfused."""
    exported = torch.export.export(_WithChunked(), tuple(_inputs()), strict=False).module()
    monkeypatch.setattr(rotary_calls, "FUSE_WITH_CHUNKED", False)
    assert rotary_module(exported, enabled=True) is exported
    monkeypatch.setattr(rotary_calls, "FUSE_WITH_CHUNKED", True)
    fused = rotary_module(exported, enabled=True)
    assert _targets(fused).count(OPS.rotary_paged_attention.default) == len(ATTENTION)
    for got, expected in zip(_run(fused), _run(exported)):
        assert torch.equal(got, expected)


def test_fusion_at_capture_follows_the_switch():
    exported = _exported()
    assert rotary_module(exported, enabled=False) is exported
    assert (rotary_module(exported) is exported) == (not rotary_calls.FUSE_AT_CAPTURE)


class _Projected(torch.nn.Module):
    """A layer whose attention output feeds the output projection through one reshape."""

    def forward(self, qkv, cos, sin, k_cache, v_cache, slots, page_table, starts, positions, weight):
        q, k, v = qkv.split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
        plane_k, plane_v = k_cache[0], v_cache[0]
        q = OPS.rotary_cache_write(q.reshape(ROWS, HEADS, DIM), k.reshape(ROWS, KV_HEADS, DIM),
                                   v.reshape(ROWS, KV_HEADS, DIM), cos, sin, plane_k, plane_v, slots)
        attended = OPS.paged_attention(q, plane_k, plane_v, page_table, starts, positions, 0.35, 0)
        return torch.nn.functional.linear(attended.reshape(ROWS, HEADS * DIM), weight)


def test_the_output_projection_weight_is_the_prefetch_hint():
    inputs = _inputs()
    args = (inputs[0][0], *inputs[1:9], torch.randn(16, HEADS * DIM))
    exported = torch.export.export(_Projected(), args, strict=False).module()
    fused = rotary_module(exported, enabled=True)
    graph = fused.graph
    assert prefetch_output_weights(graph) == 1
    call = next(n for n in graph.nodes if n.target is OPS.rotary_paged_attention.default)
    linear = next(n for n in graph.nodes if n.target is torch.ops.aten.linear.default)
    assert call.args[15] is linear.args[1]
    hinted = torch.fx.GraphModule(fused, graph)
    expected = exported(*args)
    assert torch.equal(hinted(*(t.clone() for t in args)), expected)  # a hint: the CPU result is the same
    assert prefetch_output_weights(graph, enable=False) == 1 and call.args[15] is None


def test_the_hint_is_limited_by_the_static_token_count():
    inputs = _inputs()
    args = (inputs[0][0], *inputs[1:9], torch.randn(16, HEADS * DIM))
    graph = rotary_module(torch.export.export(_Projected(), args, strict=False).module(), enabled=True).graph
    assert prefetch_output_weights(graph, max_tokens=ROWS - 1) == 0  # the call has ROWS tokens
    assert prefetch_output_weights(graph, max_tokens=ROWS) == 1
