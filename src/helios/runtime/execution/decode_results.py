"""The completion of a plain decode plan, validated in one pass.

In a plain decode plan every row is a generating lane of one position (it samples, feeds one
token, admits no slot and is not speculative). Its completion record is fully determined except
for the sampled token: slot, generation, submission, offered 1, accepted 0, emitted 1, consumed
end start + 1, the draft cursor the lag gives, and the reserved field. `plain_decode_results`
reads the record once (`tolist`), compares each row with those values and checks the token's
range, building the `RowResult`s as it goes. It returns None as soon as anything differs (or a
row is not plain): the executor then validates lane by lane
(`helios.abi.completion.validate_completion`), which accepts exactly the same records and names
the first broken rule of any other. So the results, and the errors, are the lane-by-lane path's.

One pass over Python lists, not numpy: at decode batches of 1 to 64 the dozen numpy calls an
array comparison takes cost more than the loop (measured: 56 us against 19 us at 16 rows).

Thread ownership: the executor's (the model worker's).
"""

from __future__ import annotations

from typing import Sequence

import torch

from helios.abi.completion import NO_DRAFT_CURSOR, NUM_FIELDS, RESERVED_VALUE
from helios.runtime.records.plan import PlanRow, RowResult


def plain_decode_results(rows: Sequence[PlanRow], record: torch.Tensor, submission: int, vocab_size: int,
                         draft_lag: int | None, packed_capacity: int) -> tuple[RowResult, ...] | None:
    """The rows' `RowResult`s when `record` (int64 [>= rows, >= NUM_FIELDS], on the host) is a
    valid completion of a plain decode plan whose tokens are the ABI token column; else None."""
    if not rows or len(rows) > packed_capacity or record.device.type != "cpu" or record.shape[0] < len(rows):
        return None
    results = []
    append, new = results.append, tuple.__new__
    for row, fields in zip(rows, record[:len(rows), :NUM_FIELDS].tolist()):  # LAYOUT order
        token, end = fields[3], row.start_pos + 1
        cursor = NO_DRAFT_CURSOR if draft_lag is None else max(end - draft_lag, 0)
        # The whole record row against what the plan gives (the token against itself: range-checked).
        if (fields != [row.slot, row.generation, submission, token, 1, 0, 1, end, cursor, RESERVED_VALUE]
                or row.query_len != 1 or not row.samples or row.admits or not 0 <= token < vocab_size):
            return None
        append(new(RowResult, (fields[0], fields[1], end, (token,), 1, 0, cursor, None)))  # RowResult(...)'s tuple
    return tuple(results)
