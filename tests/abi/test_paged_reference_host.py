"""`helios.abi.paged_reference` on the CPU: the decode group's plan computed in numpy equals the
torch computation the reference runs elsewhere (page ids, visibility, additive mask: dtype, shape
and values)."""

from __future__ import annotations

import pytest
import torch

from helios.abi import paged_reference
from helios.abi.paged_reference import AbiArgumentError, _group_host, _group_torch


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("window", [0, 1, 5])
@pytest.mark.parametrize("position_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("positions", [[0, 7, 3, 19, 12], [23, 23, 0, 4, 1], [5, -1, 3, 2, 0]])  # -1: a padding row
def test_the_host_plan_of_a_decode_group_is_the_torch_plan(window, position_dtype, positions):
    generator = torch.Generator().manual_seed(window)
    plane_pages, page_tokens = 12, 4
    page_table = torch.randint(-3, plane_pages + 3, (5, 6), dtype=torch.int32, generator=generator)  # clamped
    positions = torch.tensor(positions, dtype=position_dtype)
    for tokens in (slice(0, 5), torch.tensor([0, 2, 4, 6, 7])):
        host = _group_host(tokens, page_table, positions, window, plane_pages, page_tokens)
        reference = _group_torch(tokens, page_table, positions, window, plane_pages, page_tokens)
        assert host.num_rows == reference.num_rows == 5 and host.tokens is tokens
        for got, expected in zip(host[1:], reference[1:]):
            if isinstance(got, torch.Tensor):
                assert _same(got, expected)
        assert bool(host.page_ids.min()) >= 0 and int(host.page_ids.max()) < plane_pages
        assert host.allowed.numpy().flags.writeable and host.mask.numpy().flags.writeable  # fresh arrays


def test_the_causal_tables_are_built_once_per_extent_and_read_only():
    visible, additive = paged_reference._causal(8)
    assert paged_reference._causal(8)[0] is visible and not visible.flags.writeable and not additive.flags.writeable
    assert visible[3].tolist() == [True] * 4 + [False] * 4
    assert additive[3].tolist() == [0.0] * 4 + [float("-inf")] * 4 and additive.dtype.name == "float32"


def test_the_host_plan_refuses_a_position_past_the_page_table():
    page_table = torch.zeros((2, 2), dtype=torch.int32)
    with pytest.raises(AbiArgumentError, match="needs 3 pages; the page table has 2"):
        _group_host(slice(0, 2), page_table, torch.tensor([3, 8]), 0, 4, 4)


def test_plans_of_cpu_tensors_take_the_host_computation(monkeypatch):
    def fail(*args):
        raise AssertionError("the torch plan ran for CPU tensors")
    monkeypatch.setattr(paged_reference, "_group_torch", fail)
    page_table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    plan = paged_reference.plan_attention(page_table, torch.tensor([0, 1, 2], dtype=torch.int32),
                                          torch.tensor([4, 1]), 0, torch.zeros(4, 4, 1, 2))
    assert plan.full and plan.group.page_ids.tolist() == [1, 2, 3, 0]
