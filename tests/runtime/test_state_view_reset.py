"""The runtime's reset of an admitted slot (a core without an INITIALIZATION graph) zeroes exactly
the state views the graphs holding request lanes write, by their byte geometry (`Packer.reset_admitted`): the
slot's bytes of each per-row view, not the buffer's leading rows of a whole-buffer view (a global
counter no slot owns), nor the bytes of a row no written view covers. The example contract keeps
three views in one per-row buffer (``state.requests``) and a whole-buffer ``step_counter``."""

from __future__ import annotations

import torch

from contract.documents import decode_doc, drop_graphs, example_doc, graph
from helios.contract import manifest_pb2 as mpb
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.packer import Packer
from helios.runtime.loading.model import _DTYPES
from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import PlanRow, StepPlan

STATE_ROWS, SLOTS = 2, 4


def test_an_admitted_slot_zeroes_the_bytes_of_the_views_its_graph_writes():
    doc = example_doc()
    drop_graphs(doc, {"GRAPH_OPERATION_INITIALIZATION"})  # the runtime resets admitted slots itself
    prefill, _ = graph(doc, "prefill")
    prefill["state_accesses"] = [a for a in prefill["state_accesses"] if a["view"] != "request_counters"]
    prefill["state_accesses"].append({"view": "step_counter", "mode": "ACCESS_MODE_READ_WRITE"})
    prepared = decode_doc(doc)
    buffers = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role in (mpb.BUFFER_ROLE_INPUT, mpb.BUFFER_ROLE_PERSISTENT_STATE):
            shape = [d.size if d.WhichOneof("extent") == "size" else SLOTS * STATE_ROWS for d in buffer.shape]
            buffers[buffer.name] = torch.full(shape, 7, dtype=_DTYPES[buffer.dtype])
    staging = host_staging(prepared, {"w.engram": torch.zeros(65536, 64)}, buffers)
    packer = Packer(prepared, buffers, state_rows=STATE_ROWS, host_staging=staging)
    admitted = PlanRow("a", 1, 3, (5, 6), False, 0, 2, 0, (), True, 0, 1, True, False)
    packer.reset_admitted("prefill", StepPlan(1, 0, Operation.PREFILL, None, (admitted,), (), 2))

    assert buffers["state.global"].tolist() == [7] * 4  # the global step counter: no slot's row
    requests = buffers["state.requests"]  # int32 [rows, 8]: pending [0, 4), rng [8, 16), counters [16, 32)
    slot_rows = requests[STATE_ROWS:2 * STATE_ROWS]
    assert slot_rows[:, 0].eq(0).all() and slot_rows[:, 2:4].eq(0).all()  # the views prefill writes
    assert slot_rows[:, 1].eq(7).all()  # bytes no view covers
    assert slot_rows[:, 4:].eq(0).all()  # request_counters: prefill leaves them, decode writes them (zeroed too)
    others = torch.cat([requests[:STATE_ROWS], requests[2 * STATE_ROWS:]])
    assert others.eq(7).all()  # other slots' rows
    assert buffers["state.histograms"][STATE_ROWS:2 * STATE_ROWS].eq(0).all()  # a whole-row view
    assert buffers["state.histograms"][:STATE_ROWS].eq(7).all()
