"""Pinned host rows that admission values of a device buffer's physical request rows are copied
from: one asynchronous copy per row, ordered before the program on the current stream, where a
copy from pageable memory (``row[...] = torch.tensor(values)``) would synchronise the stream.

Each execution frame has its own `ROWS_PER_FRAME` rows per buffer, rewritten only after the
frame's previous plan finished (as the packer's mirrors); a step that writes more rows of one
buffer than that waits for the stream once before it reuses its frame's rows.

Thread ownership: the packer's (one model worker); not thread-safe.
"""

from __future__ import annotations

import torch

ROWS_PER_FRAME = 4


class PinnedRows:
    """Per-frame rings of pinned host rows shaped like one row of a buffer (module docstring)."""

    def __init__(self, row: torch.Tensor, pinned: bool):
        self.rows = [[torch.zeros(row.shape, dtype=row.dtype, pin_memory=pinned) for _ in range(ROWS_PER_FRAME)]
                     for _ in range(2)]
        self.frame = 0
        self._used = 0

    def begin(self, frame: int) -> None:
        """A plan of `frame` starts packing: its previous plan finished, so its rows are free."""
        self.frame = frame % 2
        self._used = 0

    def take(self, target: torch.Tensor) -> int:
        """The index of this frame's next free row for a copy into `target` (after waiting for
        the stream when every row of the frame holds a copy of this step)."""
        if self._used == ROWS_PER_FRAME:
            if target.device.type == "cuda":
                torch.cuda.current_stream(target.device).synchronize()
            self._used = 0
        self._used += 1
        return self._used - 1

    def write(self, target: torch.Tensor, values) -> None:
        """target[:] = values (a sequence shaped like the row), by one asynchronous copy."""
        host = self.rows[self.frame][self.take(target)]
        host.copy_(torch.tensor(values, dtype=host.dtype).reshape(host.shape))
        target.copy_(host, non_blocking=True)
