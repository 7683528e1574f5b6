"""The CPU paged attention kernel (`helios.runtime.loading.decode_attention_kernel`): a step's
attention equals the reference `attend` within float rounding (decode steps, prompt chunks beside
decoding rows, padding tokens; group sizes compiled in and another, head sizes that are not a
multiple of the vector width, windows, pages in any order, page ids out of the plane, planes that
are views of a layered buffer, one and two threads); a token's result is the same bits in any step
(alone, in a decode batch, inside a prompt chunk); the blocked scores and paired value passes of
groups of one or two over long contexts in large pages, and the kernel built for 256-bit vectors (in
a subprocess), equal the reference and keep each token's bits; other dtypes and layouts run the reference
itself over the step's plan; `plan_tokens` keeps the step's tensors only for well-formed inputs
within the page table; programs point their planned attention calls and plans at it; a failure to
build it in a compiled load is a `ProgramCompileError`."""

from __future__ import annotations

import pytest
import torch

from helios.abi import cpu_bodies
from helios.abi.paged_reference import AbiArgumentError, AttentionPlan, attend, plan_attention
from helios.runtime.loading import program_compile
from helios.runtime.loading.cpu_programs import cpu_program
from helios.runtime.loading.decode_attention_kernel import (
    TokenStep, bind_decode_attention, build_kernel, decode_attention, plan_tokens,
)
from helios.runtime.loading.program_compile import ProgramCompileError, compile_programs
from runtime.test_cpu_fast import _inputs, _program, _weights

PAGE_TOKENS, PLANE_PAGES = 4, 24


@pytest.fixture(scope="module")
def body():
    return decode_attention(build_kernel())


@pytest.fixture
def threads():
    def use(count: int) -> None:
        torch.set_num_threads(count)
    before = torch.get_num_threads()
    yield use
    torch.set_num_threads(before)


def _planes(kv_heads: int, head_dim: int, dtype=torch.float32, seed: int = 0):
    """k and v planes [pages, page tokens, Hkv, D]: layer 1 of a [3, ...] buffer each (strided views)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (3, PLANE_PAGES, PAGE_TOKENS, kv_heads, head_dim)
    return (torch.randn(shape, generator=generator).to(dtype)[1], torch.randn(shape, generator=generator).to(dtype)[1])


def _step(positions: list[int], window: int, k_cache, q_heads: int, dtype=torch.float32, seed: int = 0):
    """(`TokenStep`, the reference plan, q) of a full decode step: each row's pages a random choice
    of the plane's pages, and one entry of each row past the plane (clamped; read only when named)."""
    generator = torch.Generator().manual_seed(seed + 1)
    rows, head_dim = len(positions), k_cache.shape[3]
    table = torch.stack([torch.randperm(PLANE_PAGES, generator=generator)[:6] for _ in range(rows)]).to(torch.int32)
    table[:, 5] = PLANE_PAGES + 3
    table[0, 0] = -2  # clamped to page 0
    arguments = (table, torch.arange(rows + 1, dtype=torch.int32), torch.tensor(positions), window, k_cache)
    return plan_tokens(*arguments), plan_attention(*arguments), torch.randn(rows, q_heads, head_dim,
                                                                            generator=generator).to(dtype)


@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(4, 2, 32), (6, 2, 40), (3, 3, 8), (8, 1, 64), (20, 2, 16)])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("count", [1, 2])
def test_the_kernel_equals_the_reference_attention(body, threads, q_heads, kv_heads, head_dim, window, count):
    threads(count)
    k_cache, v_cache = _planes(kv_heads, head_dim, seed=head_dim)
    positions = [0, 3, 4, 17, 23, -1, 9, 12]  # across pages; -1: a padding row (nothing visible)
    step, plan, q = _step(positions, window, k_cache, q_heads, seed=window)
    assert isinstance(step, TokenStep) and plan.full
    got = body(q, k_cache, v_cache, step, head_dim ** -0.5)
    expected = attend(plan, q, k_cache, v_cache, head_dim ** -0.5)
    assert got.dtype == torch.float32 and got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[5], torch.zeros_like(got[5])) and torch.equal(expected[5], got[5])


def test_the_kernel_reads_nothing_past_a_rows_context(body):
    k_cache, v_cache = _planes(2, 16)
    step, plan, q = _step([2, 6], 0, k_cache, 4)
    expected = body(q, k_cache, v_cache, step, 0.25)
    ids = plan.group.page_ids.view(2, -1)
    poisoned_k, poisoned_v = k_cache.clone(), v_cache.clone()
    for row, position in enumerate([2, 6]):  # positions past each row's own, and pages it never names
        page, slot = divmod(position, PAGE_TOKENS)
        for plane in (poisoned_k, poisoned_v):
            plane[ids[row, page], slot + 1:] = float("nan")
    unused = sorted(set(range(PLANE_PAGES)) - set(ids[0, :1].tolist()) - set(ids[1, :2].tolist()))
    poisoned_k[unused] = poisoned_v[unused] = float("nan")
    assert torch.equal(body(q, poisoned_k, poisoned_v, step, 0.25), expected)


def test_other_calls_run_the_reference_over_the_steps_plan_bit_for_bit(body):
    k_cache, v_cache = _planes(2, 8, torch.bfloat16)
    step, plan, q = _step([3, 7], 0, k_cache, 4, torch.bfloat16)  # another dtype
    assert torch.equal(body(q, k_cache, v_cache, step, 0.3), attend(plan, q, k_cache, v_cache, 0.3))
    assert step.plan() is step.plan()  # built once per step, for every layer
    k_cache, v_cache = _planes(2, 8)
    step, plan, q = _step([3, 7], 0, k_cache, 4)
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous
    assert torch.equal(body(strided, k_cache, v_cache, step, 0.3), attend(plan, strided, k_cache, v_cache, 0.3))


def _mixed(k_cache, q_heads: int, seed: int = 0):
    """(`TokenStep`, the reference plan, q, positions) of a step with a decoding row, a prompt chunk of
    five tokens, another decoding row and two padding tokens past the rows."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.stack([torch.randperm(PLANE_PAGES, generator=generator)[:6] for _ in range(3)]).to(torch.int32)
    positions = torch.tensor([13, 3, 4, 5, 6, 7, 21, 0, 0])
    bounds = torch.tensor([0, 1, 6, 7], dtype=torch.int32)
    arguments = (table, bounds, positions, 0, k_cache)
    q = torch.randn(len(positions), q_heads, k_cache.shape[3], generator=generator)
    return plan_tokens(*arguments), plan_attention(*arguments), q, table


@pytest.mark.parametrize("count", [1, 2])
def test_prompt_chunks_beside_decoding_rows_and_padding_tokens_equal_the_reference(body, threads, count):
    threads(count)
    k_cache, v_cache = _planes(2, 32, seed=3)
    step, plan, q, _ = _mixed(k_cache, 4)
    assert isinstance(step, TokenStep) and not plan.full and step.token_rows.tolist() == [0, 1, 1, 1, 1, 1, 2, -1, -1]
    got, expected = body(q, k_cache, v_cache, step, 0.2), attend(plan, q, k_cache, v_cache, 0.2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[7:], torch.zeros_like(got[7:]))


def test_a_tokens_result_is_the_same_bits_in_any_step(body):
    k_cache, v_cache = _planes(2, 32, seed=4)
    step, _, q, table = _mixed(k_cache, 4, seed=5)
    together = body(q, k_cache, v_cache, step, 0.2)
    for token, row in enumerate(step.token_rows.tolist()[:7]):  # each token alone: a one-row decode step
        alone = plan_tokens(table[row:row + 1].contiguous(), torch.tensor([0, 1], dtype=torch.int32),
                            step.positions[token:token + 1], 0, k_cache)
        assert torch.equal(body(q[token:token + 1], k_cache, v_cache, alone, 0.2)[0], together[token])


def test_plan_tokens_keeps_the_steps_tensors_only_for_well_formed_inputs_within_the_page_table():
    k_cache = torch.zeros(8, 4, 1, 8)
    table, bounds, positions = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.arange(3, dtype=torch.int32), torch.tensor([7, 2])
    assert isinstance(plan_tokens(table, bounds, positions, 0, k_cache), TokenStep)
    assert isinstance(plan_tokens(table, bounds.to(torch.int64), positions, 0, k_cache), TokenStep)
    assert isinstance(plan_tokens(table.to(torch.int64), bounds, positions, 0, k_cache), AttentionPlan)
    assert isinstance(plan_tokens(table, bounds, positions.to(torch.int32), 0, k_cache), AttentionPlan)
    assert isinstance(plan_tokens(table, torch.tensor([0, 2, 1], dtype=torch.int32), torch.tensor([1, 2, 3]), 0,
                                  k_cache), AttentionPlan)  # decreasing bounds: the reference's reading of them
    padded = plan_tokens(table, bounds, torch.tensor([7, 2, 99]), 0, k_cache)  # a padding token's position is unread
    assert isinstance(padded, TokenStep) and padded.token_rows.tolist() == [0, 1, -1]
    with pytest.raises(AbiArgumentError, match="needs 3 pages; the page table has 2"):
        plan_tokens(table, bounds, torch.tensor([8, 2]), 0, k_cache)  # as `plan_attention` refuses it


def test_compiled_programs_point_planned_attention_and_its_plan_at_the_kernel():
    graph = torch.fx.Graph()
    q, k, v, table, bounds, positions = (graph.placeholder(name) for name in ("q", "k", "v", "t", "b", "p"))
    plan = graph.call_function(plan_attention, (table, bounds, positions, 0, k))
    first = graph.call_function(cpu_bodies.attention_planned, (q, k, v, plan, 0.5))
    second = graph.call_function(cpu_bodies.attention_planned, (first, k, v, plan, 0.5))
    graph.output((second,))
    assert bind_decode_attention(graph, build_kernel()) == 2
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert targets[0] is plan_tokens and [t.__name__ for t in targets[1:]] == ["decode_attention_kernel"] * 2
    assert targets[1] is not targets[2]  # one body per call: each holds its planes' checks


def test_a_kernel_that_cannot_be_built_is_a_typed_load_error(monkeypatch):
    def fails():
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(program_compile, "build_kernel", fails)
    loaded = type("Loaded", (), {"module": cpu_program(_program()), "graph": "decode", "batch_capacity": 3,
                                 "packed_token_capacity": 3})()
    with pytest.raises(ProgramCompileError, match="decode .*no compiler today"):
        compile_programs([loaded], lambda p: [_weights(), *_inputs(0)])


def test_a_call_site_checks_again_when_its_layouts_change():
    calls = []
    kernel = build_kernel()
    body = decode_attention(lambda *args: calls.append(1) or kernel(*args))
    k_cache, v_cache = _planes(2, 8)
    step, plan, q = _step([3, 7], 0, k_cache, 4)
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    for query, ran in ((strided, 0), (q, 1), (q, 2), (strided, 2), (q.clone(), 3)):
        got = body(query, k_cache, v_cache, step, 0.3)
        torch.testing.assert_close(got, attend(plan, query, k_cache, v_cache, 0.3), rtol=1e-5, atol=1e-6)
        assert len(calls) == ran
    other_k, other_v = _planes(2, 8, torch.bfloat16)  # other planes at the same call site
    assert torch.equal(body(q.to(torch.bfloat16), other_k, other_v, step, 0.3),
                       attend(plan, q.to(torch.bfloat16), other_k, other_v, 0.3)) and len(calls) == 3


def _long_rows(q_heads: int, kv_heads: int, head_dim: int, page_tokens: int, positions: list[int], seed: int = 0):
    """(planes, `TokenStep`, reference plan, q, table) of a decode step over pages of `page_tokens`
    tokens, each row's pages a random choice of the plane's."""
    generator = torch.Generator().manual_seed(seed)
    pages = -(-(max(positions) + 1) // page_tokens)
    plane_pages = len(positions) * pages + 2
    shape = (plane_pages, page_tokens, kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    table = torch.randperm(plane_pages, generator=generator)[:len(positions) * pages].view(len(positions), pages)
    table = table.to(torch.int32).contiguous()
    arguments = (table, torch.arange(len(positions) + 1, dtype=torch.int32), torch.tensor(positions), 0, k_cache)
    q = torch.randn(len(positions), q_heads, head_dim, generator=generator)
    return k_cache, v_cache, plan_tokens(*arguments), plan_attention(*arguments), q, table


# Groups of one or two query heads take the blocked scores (kBlock keys of a page summed at once) and
# values in passes of two or four vectors: blocks whole and partial, pages of 24 and 7 tokens, heads
# of one vector, of passes only and with a partial vector after them.
@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(4, 2, 32), (2, 2, 72), (4, 2, 128), (2, 1, 40),
                                                         (1, 1, 8), (3, 1, 64)])
@pytest.mark.parametrize("page_tokens", [24, 7])
def test_long_contexts_in_large_pages_equal_the_reference_and_keep_each_tokens_bits(body, q_heads, kv_heads,
                                                                                   head_dim, page_tokens):
    positions = [70, 15, 16, 47, 0, 33]
    k_cache, v_cache, step, plan, q, table = _long_rows(q_heads, kv_heads, head_dim, page_tokens, positions,
                                                        seed=head_dim + page_tokens)
    scale = head_dim ** -0.5
    got = body(q, k_cache, v_cache, step, scale)
    torch.testing.assert_close(got, attend(plan, q, k_cache, v_cache, scale), rtol=1e-5, atol=1e-6)
    for row in range(len(positions)):  # each row alone: the same bits
        alone = plan_tokens(table[row:row + 1].contiguous(), torch.tensor([0, 1], dtype=torch.int32),
                            step.positions[row:row + 1], 0, k_cache)
        assert torch.equal(body(q[row:row + 1], k_cache, v_cache, alone, scale)[0], got[row])


# The kernel built for 256-bit vectors (blocks of 8 keys) equals the reference and keeps each token's bits: run
# in the same fresh process as the linear kernel's check (tests/runtime/test_linear_kernel.py), one process for both.
_OTHER_WIDTH = r"""  # after `run_at_256_bits`' prelude (torch imported)
from helios.abi.paged_reference import attend, plan_attention
from helios.runtime.loading.decode_attention_kernel import build_kernel, decode_attention, plan_tokens
body = decode_attention(build_kernel())
generator = torch.Generator().manual_seed(0)
positions = [40, 7, 8, 23, 0]
for q_heads, kv_heads, head_dim in [(4, 2, 32), (2, 2, 44), (1, 1, 8), (8, 2, 32), (6, 2, 20)]:
    shape = (16, 16, kv_heads, head_dim)
    k, v = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    table = torch.randperm(16, generator=generator)[:15].view(5, 3).to(torch.int32).contiguous()
    arguments = (table, torch.arange(6, dtype=torch.int32), torch.tensor(positions), 0, k)
    q = torch.randn(5, q_heads, head_dim, generator=generator)
    got = body(q, k, v, plan_tokens(*arguments), 0.3)
    torch.testing.assert_close(got, attend(plan_attention(*arguments), q, k, v, 0.3), rtol=1e-5, atol=1e-6)
    for row in range(5):
        alone = plan_tokens(table[row:row + 1].contiguous(), torch.tensor([0, 1], dtype=torch.int32),
                            torch.tensor(positions[row:row + 1]), 0, k)
        assert torch.equal(body(q[row:row + 1], k, v, alone, 0.3)[0], got[row])
print("ok")
"""
