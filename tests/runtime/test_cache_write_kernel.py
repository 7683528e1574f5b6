"""The compiled CPU cache write kernel (`helios.runtime.loading.cache_write_kernel`): the planes hold
bit for bit what `cache_write_planned` writes (rows that are views of a fused projection, planes that
are views of a layered buffer); other calls and slots outside the planes run the reference (and raise
its error); compiled programs point their planned cache writes at it."""

from __future__ import annotations

import pytest
import torch

from helios.abi import cpu_bodies
from helios.runtime.loading.cache_write_kernel import bind_cache_writes, build_kernel, cache_write

PAGES, PAGE_TOKENS, HEADS, DIM = 6, 4, 2, 8


@pytest.fixture(scope="module")
def body():
    return cache_write(build_kernel())


def _planes():
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(2, 3, PAGES, PAGE_TOKENS, HEADS, DIM, generator=generator)
    return buffer[0, 1], buffer[1, 1]  # one layer's planes of a layered buffer


def _rows(tokens: int, dtype=torch.float32):
    """k and v [T, Hkv, D] as views of one fused projection's output (rows strided)."""
    fused = torch.randn(tokens, 4 + 2 * HEADS, DIM, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    return fused[:, 4:4 + HEADS], fused[:, 4 + HEADS:]


def _both(body, k, v, plan, planes=None):
    """(the planes after the kernel's body, after the reference), from the same starting values."""
    k_cache, v_cache = planes if planes is not None else _planes()
    expected = (k_cache.clone(), v_cache.clone())
    cpu_bodies.cache_write_planned(*expected, k, v, plan)
    body(k_cache, v_cache, k, v, plan)
    return (k_cache, v_cache), expected


def test_the_kernel_writes_what_the_reference_writes(body):
    k, v = _rows(5)
    plan = cpu_bodies.plan_slots(torch.tensor([0, 23, 7, 4, 12]))
    assert plan.keep is None
    got, expected = _both(body, k, v, plan)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert torch.equal(got[0].reshape(-1, HEADS, DIM)[23], k[1]) and torch.equal(got[1].reshape(-1, HEADS, DIM)[7], v[2])


def test_padding_slots_other_dtypes_and_layouts_run_the_reference(body):
    k, v = _rows(4)
    padded = cpu_bodies.plan_slots(torch.tensor([3, -1, 9, 2]))  # a padding token: the plan keeps the others
    got, expected = _both(body, k, v, padded)
    assert padded.keep is not None and all(torch.equal(a, b) for a, b in zip(got, expected))
    strided = cpu_bodies.plan_slots(torch.tensor([3, 0, 1, 0, 9, 0, 2, 0])[::2])  # slots not contiguous
    got, expected = _both(body, k, v, strided)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    half = [tensor.to(torch.bfloat16) for tensor in _planes()]
    got, expected = _both(body, *_rows(4, torch.bfloat16), cpu_bodies.plan_slots(torch.tensor([3, 1, 9, 2])), half)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    k_cache, v_cache = _planes()
    transposed = (k_cache.transpose(2, 3).contiguous().transpose(2, 3), v_cache.transpose(2, 3).contiguous().transpose(2, 3))
    got, expected = _both(body, k, v, cpu_bodies.plan_slots(torch.tensor([3, 1, 9, 2])), transposed)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_a_slot_outside_the_planes_raises_the_references_error_with_its_writes(body):
    k, v = _rows(3)
    k_cache, v_cache = _planes()
    expected = (k_cache.clone(), v_cache.clone())
    plan = cpu_bodies.plan_slots(torch.tensor([2, PAGES * PAGE_TOKENS, 5]))
    with pytest.raises((IndexError, RuntimeError)) as caught:
        cpu_bodies.cache_write_planned(*expected, k, v, plan)
    with pytest.raises(type(caught.value), match="index"):
        body(k_cache, v_cache, k, v, plan)
    assert torch.equal(k_cache, expected[0]) and torch.equal(v_cache, expected[1])


def test_compiled_programs_point_planned_cache_writes_at_the_kernel():
    graph = torch.fx.Graph()
    k_cache, v_cache, k, v, plan = (graph.placeholder(name) for name in ("k_cache", "v_cache", "k", "v", "plan"))
    graph.call_function(cpu_bodies.cache_write_planned, (k_cache, v_cache, k, v, plan))
    graph.output(None)
    assert bind_cache_writes(graph, build_kernel()) == 1
    assert [n.target.__name__ for n in graph.nodes if n.op == "call_function"] == ["cache_write_kernel"]


def test_a_call_site_checks_again_when_its_layouts_change():
    calls = []
    kernel = build_kernel()
    body = cache_write(lambda *args: calls.append(1) or kernel(*args))
    k, v = _rows(4)
    padded, full = cpu_bodies.plan_slots(torch.tensor([3, -1, 9, 2])), cpu_bodies.plan_slots(torch.tensor([3, 1, 9, 2]))
    contiguous = (k.contiguous(), v.contiguous())
    for rows, plan, ran in ((contiguous, padded, 0), (contiguous, full, 1), ((k, v), full, 2), (contiguous, padded, 2)):
        got, expected = _both(body, *rows, plan)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)) and len(calls) == ran
    half = [tensor.to(torch.bfloat16) for tensor in _planes()]
    got, expected = _both(body, *(row.to(torch.bfloat16) for row in contiguous), full, half)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and len(calls) == 2
