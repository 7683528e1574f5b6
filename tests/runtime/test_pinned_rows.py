"""Admission rows of device buffers go through pinned per-frame rows
(`helios.runtime.execution.pinned_rows`): one asynchronous copy each, the rows of a frame reused
in turn (waiting for the stream once a step has used them all); host rows are written in place."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.pinned_rows import ROWS_PER_FRAME, PinnedRows


def _staging(buffers):
    return Staging(SimpleNamespace(graphs={}), buffers, None)


def test_host_rows_are_written_in_place():
    eos = torch.zeros(4, 3, dtype=torch.int64)
    staging = _staging({"eos": eos})
    staging.write_row("eos", eos[1], (7, 9, -1))
    assert eos.tolist() == [[0, 0, 0], [7, 9, -1], [0, 0, 0], [0, 0, 0]]


def test_device_rows_are_copied_from_the_frames_pinned_rows_in_turn():
    """``meta`` stands for a device: the values land in the frame's pinned rows, one per write."""
    params = torch.zeros(8, 3, dtype=torch.float32, device="meta")
    staging = _staging({"params": params})
    staging.begin(1, 1)
    for slot in range(ROWS_PER_FRAME + 1):
        staging.write_row("params", params[slot], (slot, 0.5, -1.0))
    rows = staging._row_rings["params"].rows
    wrapped = [[ROWS_PER_FRAME, 0.5, -1.0]]  # the fifth write reused the frame's first row
    assert [r.tolist() for r in rows[1]] == wrapped + [[s, 0.5, -1.0] for s in range(1, ROWS_PER_FRAME)]
    assert all(r.eq(0).all() for r in rows[0])  # the other frame's rows are untouched
    staging.begin(0, 2)
    staging.write_row("params", params[0], (3.0, 2.0, 1.0))
    assert rows[0][0].tolist() == [3.0, 2.0, 1.0]


def test_a_scalar_row_of_a_device_buffer_goes_through_its_ring_too():
    limits = torch.zeros(8, dtype=torch.int64, device="meta")
    staging = _staging({"limits": limits})
    staging.begin(0, 0)
    staging.write_row("limits", limits[3], (17,))
    assert staging._row_rings["limits"].rows[0][0].item() == 17


def test_a_ring_hands_out_each_row_of_its_frame_once_per_step():
    ring = PinnedRows(torch.zeros(2), pinned=False)
    ring.begin(0)
    target = torch.zeros(2)
    assert [ring.take(target) for _ in range(ROWS_PER_FRAME + 2)] == [*range(ROWS_PER_FRAME), 0, 1]
    ring.begin(1)
    assert ring.frame == 1 and ring.take(target) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rows_hold_the_values_once_the_stream_ran_the_copies():
    device = torch.device("cuda")
    ids = torch.full((2 * ROWS_PER_FRAME + 1, 5), 99, dtype=torch.int64, device=device)
    staging = _staging({"ids": ids})
    expected = {}
    for frame in (0, 1):
        staging.begin(frame, frame)
        for slot in range(frame * ROWS_PER_FRAME, frame * ROWS_PER_FRAME + ROWS_PER_FRAME + frame):
            expected[slot] = [slot, slot + 1, -1, -1, -1]
            staging.write_row("ids", ids[slot], expected[slot])
        torch.cuda.synchronize()
    assert all(ids[slot].tolist() == row for slot, row in expected.items())
