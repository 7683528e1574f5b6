"""Packed-token values written row by row through numpy equal the generic path's (one list of
every packed token's value, `write_vector`), for every dtype, offset and padding, and a step with
more packed tokens than the buffer fails the same way."""

from __future__ import annotations

import random

import pytest
import torch

from helios.contract import serving_pb2 as S
from helios.runtime.execution.bindings import Binding
from helios.runtime.execution.pack_values import write_vector
from helios.runtime.execution.packed_tokens import FAST_SOURCES, write_packed
from helios.runtime.execution.row_sources import packed_values
from helios.runtime.records.plan import PlanRow
from helios.runtime.records.request import RequestSpec


def _row(rng: random.Random, index: int) -> PlanRow:
    tokens = tuple(rng.randrange(0, 150_000) for _ in range(rng.choice((0, 1, 1, 5, 300))))
    query = len(tokens) or rng.choice((1, 3))
    return PlanRow(f"r{index}", index, 1, tokens, not tokens, rng.randrange(0, 4000), query, 0, (),
                   rng.random() < 0.6, 0, 1, False, False)


def _binding(source: int, offset: int, padding: int) -> Binding:
    return Binding("dest", "dest", source, S.INDEXING_PACKED_TOKEN, offset, padding, 0)


@pytest.mark.parametrize("source", sorted(FAST_SOURCES))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_rows_written_through_numpy_equal_the_generic_list(source, dtype):
    rng = random.Random(source * 7 + 3)
    request = RequestSpec("r", (1,), 4)
    for trial in range(20):
        rows = [_row(rng, i) for i in range(rng.randrange(0, 6))]
        binding = _binding(source, rng.choice((0, 0, 3)), rng.choice((0, -1)) if dtype != torch.bool else 0)
        capacity = sum(len(packed_values(source, row, request)) for row in rows) + rng.choice((0, 1, 17))
        fast = torch.full((capacity,), 77, dtype=dtype)
        generic = fast.clone()
        assert write_packed(fast, source, rows, binding)
        values = [v for row in rows for v in packed_values(source, row, request)]
        write_vector(generic, values, binding, pad=True)
        assert torch.equal(fast, generic), (source, dtype, trial)


def test_more_packed_tokens_than_the_buffer_fail_like_the_generic_path():
    rows = [PlanRow("r", 0, 1, tuple(range(9)), False, 0, 9, 0, (), True, 0, 1, True, False)]
    binding = _binding(S.VALUE_SOURCE_PROMPT_TOKENS, 0, 0)
    with pytest.raises(ValueError, match="9 values exceed the buffer's 8 rows"):
        write_packed(torch.zeros(8, dtype=torch.int64), S.VALUE_SOURCE_PROMPT_TOKENS, rows, binding)


def test_other_sources_and_buffers_are_left_to_the_generic_path():
    rows = [PlanRow("r", 0, 1, (4, 5), False, 0, 2, 0, (), True, 0, 1, True, False)]
    target = torch.zeros(4, dtype=torch.int64)
    assert not write_packed(target, S.VALUE_SOURCE_SCORED_TARGET_TOKENS, rows, _binding(0, 0, 0))
    assert not write_packed(torch.zeros(4, 1, dtype=torch.int64), S.VALUE_SOURCE_PROMPT_TOKENS, rows, _binding(0, 0, 0))
    assert not write_packed(torch.zeros(4, dtype=torch.bfloat16), S.VALUE_SOURCE_PROMPT_TOKENS, rows, _binding(0, 0, 0))
    assert target.eq(0).all()
