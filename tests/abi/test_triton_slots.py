"""`helios.abi.slots.packed_slots` (`helios.abi.triton_slots`): one launch against the traced slot mapping
(`helios.ignition.decoder.slot_mapping`), bit for bit: ragged rows, rows without tokens, padding
tokens, positions past a row's pages (clamped), strided page tables. Without CUDA the kernel runs
under Triton's interpreter (test_triton_attention enables it first)."""

from __future__ import annotations

import pytest
import torch

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from helios.abi.slots import packed_slots, reference_slots
from helios.abi.triton_slots import launch
from helios.ignition.decoder import slot_mapping
from test_triton_attention import DEVICE, ON_CUDA

PAGE = 16


def _case(seed: int, query_lens: list[int], padding: int, pages: int = 9):
    generator = torch.Generator().manual_seed(seed)
    lens = torch.tensor(query_lens, dtype=torch.int64)
    query_start = torch.cat((torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)))
    tables = torch.randint(0, 500, (len(query_lens), pages), generator=generator, dtype=torch.int32)
    positions = torch.randint(0, pages * PAGE + 40, (int(lens.sum()) + padding,), generator=generator)
    return query_start, tables, positions


def _slots(query_start, tables, positions):
    call = packed_slots if ON_CUDA else launch
    bounds = (PAGE, tables.shape[0] - 1, tables.shape[1] - 1, tables.shape[0])
    got = call(query_start.to(DEVICE), tables.to(DEVICE), positions.to(DEVICE), *bounds).cpu()
    return got, reference_slots(query_start, tables, positions, *bounds)


@pytest.mark.parametrize("query_lens,padding", [([1], 0), ([1] * 7, 1), ([3, 0, 1, 70, 0, 2], 5), ([0, 0], 3),
                                                ([1] * 150, 0), ([130], 0)])
def test_one_launch_gives_the_traced_slots(query_lens, padding):
    query_start, tables, positions = _case(len(query_lens) + padding, query_lens, padding)
    got, expected = _slots(query_start, tables, positions)
    assert torch.equal(got, expected)
    assert torch.equal(expected, slot_mapping(query_start, tables, positions, PAGE))  # the program's function
    assert (got[int(query_start[-1]):] == -1).all()


def test_strided_tables_and_negative_positions():
    query_start, tables, positions = _case(7, [2, 1, 1], 1)
    wide = torch.zeros(tables.shape[0], 2 * tables.shape[1], dtype=torch.int32)
    wide[:, ::2] = tables
    positions[0] = -5  # floor division and remainder as torch computes them (clamped to the first page)
    got, expected = _slots(query_start, wide[:, ::2], positions)
    assert torch.equal(got, expected)


def test_uncovered_calls_run_the_traced_calls():
    query_start, tables, positions = _case(8, [2, 1], 0)
    # on the CPU, or with a bound below zero: the traced calls themselves
    assert torch.equal(packed_slots(query_start, tables, positions, PAGE, 1, 8, 2),
                       slot_mapping(query_start, tables, positions, PAGE))
    assert torch.equal(packed_slots(query_start.to(DEVICE), tables.to(DEVICE), positions.to(DEVICE), PAGE, 1, -1, 2).cpu(),
                       reference_slots(query_start, tables, positions, PAGE, 1, -1, 2))
