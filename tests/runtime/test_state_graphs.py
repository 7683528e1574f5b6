"""SNAPSHOT, RESTORATION and RESUME graphs are served: a hybrid core declaring them
(tests/support/state_graphs_core.py) publishes its prompt-boundary snapshots through its SNAPSHOT
program (the snapshot rows are the core's own state rows), a request sharing the prefix restores
through its RESTORATION program and continues in a RESUME step, and a preempted request whose
state was offloaded (through its SNAPSHOT program and a continuation row) comes back through its
RESTORATION program and resumes through RESUME; tokens equal transformers' (a cold run)."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.contract import serving_pb2 as spb
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from support.state_graphs_core import MARKS, RESTORE_MARK, SNAPSHOT_MARK, write_state_graphs_core


def _write(hybrid, name: str, broken: bool = False):  # noqa: F811
    root, _ = hybrid
    source = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    return write_state_graphs_core(source, root / "publisher.key", NAMESPACE, root / name, broken=broken)


@pytest.fixture(scope="module")
def state_core(hybrid):  # noqa: F811
    """Written once into the session's hybrid core directory (tests/gpu/test_state_graphs_cuda
    imports this fixture: a second module must not rewrite a core the first may still read)."""
    path = hybrid[0] / "state_graphs.core"
    return path if path.is_file() else _write(hybrid, path.name)


def state_runtime(hybrid, path, device: str = "cpu", cuda_graphs: bool = True, **options):  # noqa: F811
    root, _ = hybrid
    core = open_core(path, accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(), device=device, cuda_graphs=cuda_graphs,
                       num_pages=options.pop("num_pages", None))
    return build_runtime(core, RuntimeOptions(load=load, **options))


def launches(runtime) -> dict[str, int]:
    """Program launches by operation, as /metrics reports them."""
    return dict(runtime.engine.stats.snapshot().graph_launches)


def check_snapshot_rows_are_the_cores_state_rows(runtime) -> None:
    model = runtime.model
    assert {p.graph for p in model.state_copy_programs} == {"snapshot", "restore"}
    bound = {b.source for g in model.prepared.contract.model.graphs for b in g.bindings}
    assert {spb.VALUE_SOURCE_RESTORE_SOURCE, spb.VALUE_SOURCE_SNAPSHOT_DESTINATION} <= bound
    slots, snapshots = model.settings.max_concurrency, model.settings.snapshot_capacity
    assert model.num_slot_state_rows == slots and model.num_state_rows == slots + snapshots
    storage = runtime.engine.executor.storage
    assert storage.resident_from == slots
    _, rows = storage.planes(StorageKind.CONTINUATION)
    _, slot_rows = storage.planes(StorageKind.STATE)
    for plane, slot_plane, name in zip(rows, slot_rows, ("conv_state", "ssm_state")):
        buffer = model.buffers[name]  # views of the core's planes: what the programs address
        assert plane.tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert plane.tensor.shape[1] == snapshots and slot_plane.tensor.shape[1] == slots


def test_a_shared_prefix_restores_through_the_restoration_graph(hybrid, expected, state_core):  # noqa: F811
    runtime = state_runtime(hybrid, state_core)
    check_snapshot_rows_are_the_cores_state_rows(runtime)
    marks = runtime.model.buffers[MARKS]
    cold = generate(runtime.engine, [PROMPTS[0]], STEPS)[0]
    assert list(cold.token_ids) == expected[0]
    assert runtime.engine.scheduler.counters().snapshots_published > 0
    counts = launches(runtime)  # a fresh prompt runs PREFILL; nothing is restored or resumed
    assert counts["snapshot"] >= 1 and counts["prefill"] >= 1 and not {"restoration", "resume"} & set(counts)
    first = runtime.model.num_slot_state_rows  # the first snapshot row
    written = [row for row, mark in enumerate(marks.tolist()) if mark >= SNAPSHOT_MARK]
    assert written and min(written) >= first  # the SNAPSHOT program wrote snapshot rows only
    state = runtime.model.buffers["ssm_state"]
    assert state[:, written[0]].abs().sum() > 0

    warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
    assert list(warm.token_ids) == expected[1]  # the tokens of a cold run
    counters = runtime.engine.scheduler.counters()
    assert counters.snapshots_restored == 1 and counters.prefix_reused_tokens >= len(PROMPTS[0])
    counts = launches(runtime)
    assert counts["restoration"] == 1 and counts["resume"] >= 1
    restored = [(row, mark - RESTORE_MARK) for row, mark in enumerate(marks.tolist()) if mark >= RESTORE_MARK]
    assert len(restored) == 1
    slot_row, snapshot_row = restored[0]
    assert slot_row < first <= snapshot_row


def test_a_restoration_program_that_restores_nothing_changes_the_tokens(hybrid, expected):  # noqa: F811
    """The control: the restore above is the program's (the runtime copies no state rows itself)."""
    runtime = state_runtime(hybrid, _write(hybrid, "broken.core", broken=True))
    generate(runtime.engine, [PROMPTS[0]], STEPS)
    warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
    assert launches(runtime)["restoration"] == 1
    assert list(warm.token_ids) != expected[1]


def test_preempted_requests_with_offloaded_state_resume_with_the_same_tokens(hybrid, expected,  # noqa: F811
                                                                             state_core):
    runtime = state_runtime(hybrid, state_core, num_pages=17, host_pages=32,
                            policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    results = generate(runtime.engine, PROMPTS, STEPS)
    assert runtime.engine.scheduler.counters().preemptions > 0
    assert launches(runtime)["resume"] > 0
    assert [list(r.token_ids) for r in results] == expected
    _, host_state = runtime.engine.executor.storage.planes(StorageKind.HOST)
    assert any(p.tensor.abs().sum() > 0 for p in host_state)  # state rows went to host slots and back
    runtime.engine.scheduler.check_invariants()


def test_a_snapshot_offloaded_to_the_host_restores_through_the_restoration_graph(hybrid, expected,  # noqa: F811
                                                                                  state_core):
    """The offloaded snapshot's state is what the SNAPSHOT program wrote: its restore runs the
    RESTORATION program too (the broken one, which restores nothing, changes the tokens), from a
    continuation row the host tail is copied back into."""
    for path, broken in ((state_core, False), (_write(hybrid, "broken_offloaded.core", broken=True), True)):
        runtime = state_runtime(hybrid, path, num_pages=24, host_pages=32,
                                policy=SchedulerPolicy(offload_watermark_pages=24))
        try:
            generate(runtime.engine, [PROMPTS[0]], STEPS)
            assert runtime.engine.scheduler.cache.snapshots.num_offloaded >= 1  # every free page is under the mark
            warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
            assert runtime.engine.scheduler.counters().snapshots_restored == 1
            assert launches(runtime)["restoration"] == 1
            assert (list(warm.token_ids) == expected[1]) is not broken
            runtime.engine.scheduler.check_invariants()
        finally:
            runtime.close()


def test_a_preempted_requests_offloaded_state_goes_through_the_state_programs(hybrid, expected,  # noqa: F811
                                                                              state_core):
    """Preemption's private snapshot keeps the contract of an offloaded published one: the slot's
    state reaches the host through the SNAPSHOT program (staged in a continuation row) and comes
    back through the RESTORATION program, never raw. Prefix caching is off, so every state copy is
    preemption's; the broken RESTORATION program (which restores nothing) then changes the tokens."""
    for path, broken in ((state_core, False), (_write(hybrid, "broken_preempted.core", broken=True), True)):
        runtime = state_runtime(hybrid, path, num_pages=17, host_pages=32,
                                policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD, prefix_caching=False))
        try:
            results = generate(runtime.engine, PROMPTS, STEPS)
            scheduler = runtime.engine.scheduler
            assert scheduler.counters().preemptions > 0
            counts = launches(runtime)
            assert counts.get("snapshot", 0) > 0 and counts.get("restoration", 0) > 0
            assert ([list(r.token_ids) for r in results] == expected) is not broken
            scheduler.check_invariants()
            assert scheduler.cache.snapshots.snapshots() == []  # every private snapshot was consumed
        finally:
            runtime.close()
