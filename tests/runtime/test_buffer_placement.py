"""Buffers a program reads are allocated on its device whatever their declared placement: the
example contract's MAPPED_HOST and HOST inputs (a torch program cannot read pinned host memory in
place; the packer writes them through its pinned staging), while outputs stay in host memory."""

from __future__ import annotations

from pathlib import Path

import torch

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.runtime.loading.model import _allocate

TINY = Path(__file__).resolve().parents[2] / "examples" / "contract-tiny.json"


def test_inputs_of_every_placement_live_on_the_model_device_and_outputs_on_the_host():
    prepared = PreparedContract.from_json(TINY.read_text())
    placements = {b.placement for b in prepared.manifest.buffers if b.role == mpb.BUFFER_ROLE_INPUT}
    assert {mpb.PLACEMENT_MAPPED_HOST, mpb.PLACEMENT_HOST, mpb.PLACEMENT_DEVICE} <= placements
    buffers = _allocate(prepared, num_pages=4, num_rows=4, device=torch.device("meta"))
    for buffer in prepared.manifest.buffers:
        if buffer.role == mpb.BUFFER_ROLE_WEIGHT:
            continue
        on_device = buffer.role == mpb.BUFFER_ROLE_INPUT or buffer.placement == mpb.PLACEMENT_DEVICE
        assert buffers[buffer.name].device.type == ("meta" if on_device else "cpu"), buffer.name
    assert any(b.role == mpb.BUFFER_ROLE_OUTPUT and buffers[b.name].device.type == "cpu"
               for b in prepared.manifest.buffers)
