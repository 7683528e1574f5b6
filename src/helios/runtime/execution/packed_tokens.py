"""Packed-token values of shared packing (`helios.runtime.execution.packer`) written row by row
through numpy: prompt tokens, positions and the sampling decision of every packed token.

The generic path builds one Python list of every packed token's value and converts it
(`row_sources.packed_values`, `pack_values.write_vector`): for a 2,048-token prompt two such
lists (tokens and positions) are most of the packing on the path to its first token. Here each
row's slice is written from an int64 array (positions from `numpy.arange`, tokens converted once
from the row's tuple), +offset, and the rest of the buffer gets the padding: the same values. Token
ids and positions are in range of any index dtype by then (admission checks prompt tokens against
the vocabulary, positions against the context extent).

Thread ownership: the packer's (one model worker).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.pack_values import host_array
from helios.runtime.records.plan import PlanRow

S = spb

FAST_SOURCES = frozenset({S.VALUE_SOURCE_PROMPT_TOKENS, S.VALUE_SOURCE_PROMPT_POSITIONS,
                          S.VALUE_SOURCE_SAMPLING_DECISION})


def write_packed(target: torch.Tensor, source: int, rows: Sequence[PlanRow], binding) -> bool:
    """Writes a PACKED_TOKEN binding of `source` for `rows` into the host buffer `target` (padding
    after the last packed token); False (nothing written) for a source or buffer this does not
    write, which the generic path then does. Raises ValueError when the rows hold more packed
    tokens than the buffer."""
    if source not in FAST_SOURCES or target.dim() != 1:
        return False
    array = host_array(target)
    if array is None:
        return False
    counts = [_count(source, row) for row in rows]
    total = sum(counts)
    if total > array.shape[0]:
        raise ValueError(f"{binding.destination}: {total} values exceed the buffer's {array.shape[0]} rows")
    at = 0
    for row, count in zip(rows, counts):
        if count:
            values = _values(source, row, count)
            array[at:at + count] = values + binding.offset if binding.offset else values
            at += count
    if total < array.shape[0]:
        array[total:] = binding.padding
    return True


def _count(source: int, row: PlanRow) -> int:
    """Packed tokens of `row` (`row_sources.packed_values`: a sampling decision of a row without
    host tokens covers its query length)."""
    if source == S.VALUE_SOURCE_SAMPLING_DECISION and not row.token_ids:
        return row.query_len
    return len(row.token_ids)


def _values(source: int, row: PlanRow, count: int) -> np.ndarray:
    if source == S.VALUE_SOURCE_PROMPT_TOKENS:
        return np.fromiter(row.token_ids, dtype=np.int64, count=count)
    if source == S.VALUE_SOURCE_PROMPT_POSITIONS:
        return np.arange(row.start_pos, row.start_pos + count, dtype=np.int64)
    values = np.zeros(count, dtype=np.int64)  # SAMPLING_DECISION: 1 on the token a sampling lane samples after
    if row.samples:
        values[-1] = 1
    return values
