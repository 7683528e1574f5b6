"""Prompt histograms (PROMPT_HISTOGRAM bindings: one row per slot, written at admission), counted on
the host, where the prompt is.

Only penalties read a prompt histogram: `helios.abi.sampling.apply_penalties` marks a prompt token
'seen' for the repetition penalty, and with neutral penalties (repetition 1, presence and frequency
0) the sampled tokens and log-probabilities do not depend on it. So the packer writes a slot's row
only for a request with a penalty (`SamplingParams.penalised`); other requests leave it as it is.

Counting: the prompt's ids below the row's bins, sorted and counted (`prompt_counts`; ids past the
bins - input-only ids such as image placeholders - are not counted). A host row is zeroed and
written in place. A device row is written by one asynchronous copy from a pinned host row in which
only the previous prompt's bins are cleared before the new counts are written (`HistogramRows`):
no device bincount, no device fill or add, no blocking copy (the rows per frame:
`helios.runtime.execution.pinned_rows`).

Thread ownership: the packer's (one model worker); not thread-safe.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from helios.runtime.execution.pinned_rows import ROWS_PER_FRAME, PinnedRows


def prompt_counts(tokens: Sequence[int], bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids ascending, occurrences), both int64, of the `tokens` below `bins`."""
    ids = np.fromiter(tokens, dtype=np.int64, count=len(tokens))
    if ids.size and ids.min() < 0:
        raise ValueError(f"prompt token {int(ids.min())} is negative: it has no histogram bin")
    return np.unique(ids[ids < bins], return_counts=True)


def write_host_row(row: torch.Tensor, ids: np.ndarray, counts: np.ndarray) -> None:
    """row[:] = 0, then row[ids] = counts."""
    row.zero_()
    scatter(row, ids, counts)


def scatter(row: torch.Tensor, ids: np.ndarray, values: np.ndarray) -> None:
    """row[ids] = values on a host row: through numpy where it holds the dtype (int64 values wrap
    into a narrower integer type as `Tensor.to` wraps them), else through torch."""
    if not ids.size:
        return
    try:
        array = row.numpy()
    except TypeError:  # a dtype numpy does not hold
        row[torch.from_numpy(ids)] = torch.from_numpy(values).to(row.dtype)
        return
    array[ids] = values


class HistogramRows:
    """Pinned host rows (per frame) that device histogram rows are copied from (module docstring)."""

    def __init__(self, row: torch.Tensor, pinned: bool):
        self._rows = PinnedRows(row, pinned)
        self._written = [[np.empty(0, dtype=np.int64)] * ROWS_PER_FRAME for _ in range(2)]  # nonzero bins

    def begin(self, frame: int) -> None:
        """A plan of `frame` starts packing: its previous plan finished, so its rows are free."""
        self._rows.begin(frame)

    def write(self, target: torch.Tensor, ids: np.ndarray, counts: np.ndarray) -> None:
        """target[:] = the histogram (`ids`, `counts`), by one asynchronous copy on the current stream."""
        index = self._rows.take(target)
        frame = self._rows.frame
        host = self._rows.rows[frame][index]
        written = self._written[frame]
        scatter(host, written[index], np.zeros_like(written[index]))  # the previous prompt's bins
        scatter(host, ids, counts)
        written[index] = ids
        target.copy_(host, non_blocking=True)
