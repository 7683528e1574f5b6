"""State rows, snapshots and preemption: an offload that can never checkpoint says so at load; an admitted slot starts from zeros in every view a lane graph writes; no final snapshot past an EOS a speculative lane emitted; a snapshot after a restore in one plan takes the admitted generation; chunked copies upload before the next chunk is packed."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from contract.documents import decode_doc, drop_graphs, example_doc, graph
from helios.contract import manifest_pb2 as mpb
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.packer import Packer
from helios.runtime.execution.state_programs import RESTORATION, SNAPSHOT, StatePrograms
from helios.runtime.loading.model import _DTYPES
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishReason
from helios.runtime.records.plan import CopyOp, Location, PlanRow, RowResult, StepPlan, StorageKind
from helios.runtime.scheduling import scheduler as scheduler_module
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

from .fake_model import reference
from .harness import make, spec

OFFLOAD = SchedulerPolicy(preemption=PreemptionMode.OFFLOAD)


def op_copy(src, src_index, dst, dst_index, tokens=0) -> CopyOp:
    return CopyOp(Location(src, src_index), Location(dst, dst_index), tokens)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == scheduler_module.__name__ and r.levelno == logging.WARNING]


def test_offload_on_a_state_program_core_without_snapshot_rows_says_it_recomputes(caplog):
    """A core whose state reaches the host only through its SNAPSHOT program and a continuation row,
    loaded with a snapshot capacity of 0, can checkpoint no victim: OFFLOAD recomputes every one.
    Startup says so once, naming the setting (it used to be silent)."""
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        scheduler, driver = make(OFFLOAD, stateful=True, programs=True, rows=0, max_active=3, num_pages=7)
    (message,) = _warnings(caplog)
    assert "--snapshot-capacity" in message and "recomputed" in message
    prompts = {"a": list(range(1, 9)), "b": list(range(20, 27)), "c": list(range(40, 47))}
    driver.submit(*(spec(name, prompt, 6) for name, prompt in prompts.items()))
    outcomes = driver.run()
    assert scheduler.counters().preemptions > 0  # (what the warning announces: none is offloaded)
    assert not any(copy.dst.kind.name == "HOST" for plan in driver.plans for copy in plan.copies)
    for name, prompt in prompts.items():
        assert outcomes[name].tokens == reference(prompt, 6, stateful=True)


@pytest.mark.parametrize("policy, options", [
    (OFFLOAD, dict(stateful=True, programs=True, rows=1)),  # a continuation row to stage through
    (OFFLOAD, dict(stateful=True, programs=False, rows=0)),  # raw state rows go straight to host slots
    (OFFLOAD, dict(stateful=False, programs=True, rows=0)),  # pages hold the state
    (SchedulerPolicy(), dict(stateful=True, programs=True, rows=0)),  # recomputing is what was asked for
])
def test_offload_with_room_to_checkpoint_warns_nothing(caplog, policy, options):
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        make(policy, **options)
    assert _warnings(caplog) == []


def test_offload_without_host_slots_says_it_recomputes(caplog):
    with caplog.at_level(logging.WARNING, logger=scheduler_module.__name__):
        make(OFFLOAD, host_slots=0)
    (message,) = _warnings(caplog)
    assert "--host-pages" in message


def test_an_admitted_slot_starts_from_zeros_in_views_only_other_graphs_write():
    """A view the admitting PREFILL does not touch but DECODE reads and writes (request counters a
    decode step accumulates) is the new request's too: the runtime's reset, which stands in for an
    INITIALIZATION program, zeroes it. It kept the previous owner's counters, which the first DECODE
    of the new request then read."""
    rows, slots = 2, 4
    doc = example_doc()
    drop_graphs(doc, {"GRAPH_OPERATION_INITIALIZATION"})
    prefill, _ = graph(doc, "prefill")
    prefill["state_accesses"] = [a for a in prefill["state_accesses"] if a["view"] != "request_counters"]
    prepared = decode_doc(doc)
    buffers = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role in (mpb.BUFFER_ROLE_INPUT, mpb.BUFFER_ROLE_PERSISTENT_STATE):
            shape = [d.size if d.WhichOneof("extent") == "size" else slots * rows for d in buffer.shape]
            buffers[buffer.name] = torch.full(shape, 7, dtype=_DTYPES[buffer.dtype])
    packer = Packer(prepared, buffers, state_rows=rows,
                    host_staging=host_staging(prepared, {"w.engram": torch.zeros(65536, 64)}, buffers))
    admitted = PlanRow("a", 1, 3, (5, 6), False, 0, 2, 0, (), True, 0, 1, True, False)
    packer.reset_admitted("prefill", StepPlan(1, 0, Operation.PREFILL, None, (admitted,), (), 2))

    requests = buffers["state.requests"]  # int32 [rows, 8]: request_counters are bytes [16, 32)
    slot_rows = requests[rows:2 * rows]
    assert slot_rows[:, 4:].eq(0).all()  # the counters DECODE reads and writes: the new request's, zeroed
    assert slot_rows[:, 1].eq(7).all()  # bytes no view covers are kept
    assert torch.cat([requests[:rows], requests[2 * rows:]]).eq(7).all()  # other slots' rows
    assert buffers["state.global"].eq(7).all()  # a whole-buffer view belongs to no slot


def test_no_final_snapshot_of_state_that_ran_past_an_eos_inside_a_speculative_lane():
    """A speculative lane that emits an EOS before its last token consumed tokens past the EOS (the
    program knows no EOS ids): the request's history ends at the EOS, its recurrent state after it.
    Its final snapshot would publish that state at the history's endpoint, where a later prompt
    sharing the prefix restores it; it must not be captured (it was, at that endpoint)."""
    scheduler, driver = make(SchedulerPolicy(two_frames=False), stateful=True, speculative=(3, 4), max_active=2)
    eos = 5
    driver.submit(spec("a", list(range(10, 16)), 8, eos_ids=frozenset({eos}), publish_snapshot=True))
    plan = scheduler.schedule()  # the prompt
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    plan = scheduler.schedule()
    published = {s.snapshot_id for s in scheduler.cache.snapshots.snapshots()}  # the prompt's, captured here
    assert plan.operation == Operation.SPECULATIVE and plan.rows[0].token_ceiling == 4
    row = plan.rows[0]
    emitted = (eos, 7, 8)  # EOS first: the program went on consuming it and 7
    result = RowResult(row.slot, row.generation, row.start_pos + len(emitted), emitted, len(emitted), len(emitted) - 1)
    events = scheduler.complete(plan, [result])
    assert any(getattr(e, "reason", None) == FinishReason.EOS for e in events)
    new = [s for s in scheduler.cache.snapshots.snapshots() if s.snapshot_id not in published]
    assert new == []  # no snapshot of a state past its endpoint
    scheduler.check_invariants()


class _CopyRows:
    """A packer that records the state-copy rows each SNAPSHOT/RESTORATION launch is packed with."""

    def __init__(self):
        self.packed = []

    def pack_state_copies(self, graph, plan, rows):
        self.packed.append((graph, list(rows)))


def _state_programs(packer):
    programs = tuple(SimpleNamespace(operation=operation, graph=graph, batch_capacity=2, inputs=(), input_shapes=(),
                                     weights=())
                     for operation, graph in ((SNAPSHOT, "snapshot"), (RESTORATION, "restore")))
    model = SimpleNamespace(state_rows_per_request=2, num_slot_state_rows=8, device=torch.device("cpu"),
                            state_copy_programs=programs, weights={}, buffers={})
    return StatePrograms(model, packer, lambda program, arguments: None)


def test_a_snapshot_after_a_restore_in_the_same_plan_carries_the_admitted_requests_generation():
    """A request readmitted from its private snapshot exactly at its prompt boundary (preempted right
    after its prompt) is checkpointed there in the plan that restores it: the SNAPSHOT program then
    copies the state the RESTORATION program just wrote, the admitted request's, and gets its
    generation (it got the slot's previous owner's). A snapshot before the restore (the previous
    owner's final one) keeps the previous owner's."""
    packer = _CopyRows()
    programs = _state_programs(packer)
    earlier = PlanRow("old", 1, 4, (3,), False, 0, 1, 0, (), True, 0, 1, True, False)
    programs.observe(StepPlan(0, 0, Operation.PREFILL, None, (earlier,), (), 1))
    admitted = PlanRow("new", 1, 5, (9,), False, 12, 1, 0, (), True, 0, 1, True, False)
    copies = (op_copy(StorageKind.STATE, 1, StorageKind.CONTINUATION, 0),  # the old owner's final snapshot
              op_copy(StorageKind.CONTINUATION, 2, StorageKind.STATE, 1),  # the new owner's restore
              op_copy(StorageKind.STATE, 1, StorageKind.CONTINUATION, 3))  # its prompt-boundary checkpoint
    plan = StepPlan(1, 1, Operation.PREFILL, None, (admitted,), copies, 1)
    for run in StatePrograms.runs(copies):
        programs.run(plan, run.operation, run.copies)
    assert [(graph, [(r.slot, r.generation, r.snapshot_row) for r in rows]) for graph, rows in packer.packed] == [
        ("snapshot", [(1, 4, 8)]), ("restore", [(1, 5, 12)]), ("snapshot", [(1, 5, 14)])]


def test_each_chunk_of_state_copies_is_uploaded_before_the_next_is_packed(monkeypatch):
    """More copies of one kind than the largest variant holds run in chunks; every chunk's pack
    writes the same pinned staging mirrors, uploaded asynchronously. On CUDA the host must wait for
    a chunk's upload (and program) before packing the next, or the first chunk's program reads the
    second chunk's rows (it waited only after the last chunk)."""
    events = []

    class Packer:
        def pack_state_copies(self, graph, plan, rows):
            events.append(("pack", [r.slot for r in rows]))

    class Stream:
        def synchronize(self):
            events.append(("wait",))

    programs = _state_programs(Packer())
    programs._device = torch.device("cuda")  # (a stand-in stream: no CUDA here)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    copies = tuple(op_copy(StorageKind.STATE, slot, StorageKind.CONTINUATION, slot) for slot in range(3))
    plan = StepPlan(1, 1, Operation.DECODE, None, (), copies, 0)
    assert programs.run(plan, SNAPSHOT, copies) == 2  # chunks of the largest variant's 2 rows
    assert events == [("pack", [0, 1]), ("wait",), ("pack", [2]), ("wait",)]


def test_each_chunk_of_initialized_rows_is_uploaded_before_the_next_is_packed(monkeypatch):
    """The INITIALIZATION program runs over a plan's admitted rows in chunks of its largest variant,
    each packed into the same pinned staging mirrors: on CUDA the host must wait for a chunk before
    packing the next (it waited only after the last, so the first chunk's program could initialize
    the second chunk's rows and leave its own slots with the previous owner's state)."""
    from types import SimpleNamespace

    from helios.runtime.execution.executor import Executor
    from helios.runtime.records.plan import PlanRow

    events = []

    class Stream:
        def synchronize(self):
            events.append(("wait",))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    programs = [(SimpleNamespace(batch_capacity=capacity, graph=f"init{capacity}"), []) for capacity in (1, 2)]
    executor = SimpleNamespace(
        _initializers=programs, model=SimpleNamespace(device=torch.device("cuda")),  # a stand-in stream
        packer=SimpleNamespace(pack=lambda graph, plan: events.append(("pack", [r.slot for r in plan.rows]))),
        _encode=lambda program, args: events.append(("launch",)))
    rows = tuple(PlanRow(f"r{slot}", slot, 1, (1,), False, 0, 1, 0, (), True, 0, 1, True, False) for slot in range(3))
    Executor._initialize(executor, StepPlan(1, 1, Operation.DECODE, None, rows, (), 0))
    assert events == [("pack", [0, 1]), ("launch",), ("wait",), ("pack", [2]), ("launch",), ("wait",)]
