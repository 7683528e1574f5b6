"""The SLOT and GENERATION a core's SNAPSHOT and RESTORATION programs are given: those of the request
whose state the copy moves. A request's final snapshot (`publish_snapshot`) runs in the plan after
its end, which may admit the next request into the same slot, or hold no row at all; the snapshot
still copies the ended request's state, under its generation (tests/support/state_graphs_core.py)."""

from __future__ import annotations

from helios.contract import StartupOptions
from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.loading.model import LoadOptions
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_hybrid_runtime import NAMESPACE, PREFIX, hybrid  # noqa: F401 (fixtures)
from runtime.test_state_graphs import state_core  # noqa: F401 (fixture)


def _one_slot_runtime(hybrid, path):  # noqa: F811
    root, _ = hybrid
    core = open_core(path, accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(max_concurrency=1), device="cpu", cuda_graphs=True)
    return build_runtime(core, RuntimeOptions(load=load))


def test_state_copies_carry_the_generation_of_the_request_whose_state_they_copy(hybrid, state_core):  # noqa: F811
    runtime = _one_slot_runtime(hybrid, state_core)
    engine = runtime.engine
    packer = engine.executor.packer
    owners: dict[int, int] = {}  # slot -> generation of its latest row in the plans applied before
    copies = []  # (graph, copied (slot, generation), expected (slot, generation), plan admits the slot)
    apply, pack_state_copies = packer.apply, packer.pack_state_copies

    def on_apply(plan):
        apply(plan)
        on_apply.rows = {row.slot: row for row in plan.rows}  # the plan's rows run after its copies

    def on_copies(graph, plan, rows):
        for row in rows:
            admitted = on_apply.rows.get(row.slot)
            # a snapshot copies what earlier plans computed; a restore feeds the row this plan admits
            owner = admitted.generation if graph == "restore" else owners.get(row.slot)
            copies.append((graph, (row.slot, row.generation), (row.slot, owner),
                           admitted is not None and admitted.admits))
        pack_state_copies(graph, plan, rows)

    def on_launch(plan, launch=engine.executor.launch, **kwargs):
        launched = launch(plan, **kwargs)
        owners.update((row.slot, row.generation) for row in plan.rows)
        return launched

    packer.apply, packer.pack_state_copies, engine.executor.launch = on_apply, on_copies, on_launch
    try:
        prompts = [PREFIX[:13], PREFIX[:7] + [60, 61], PREFIX + [50]]  # the last restores the first's prompt
        for index, prompt in enumerate(prompts):
            engine.submit(EngineRequest(RequestSpec(f"r{index}", tuple(prompt), 4, publish_snapshot=True),
                                        lambda event: None))
        engine.run_until_idle()
    finally:
        runtime.close()
    assert [(graph, copied) for graph, copied, _, _ in copies] == [(graph, owner) for graph, _, owner, _ in copies]
    snapshots = [c for c in copies if c[0] == "snapshot"]
    assert any(admits for *_, admits in snapshots)  # a final snapshot ran in the plan handing its slot on
    assert snapshots[-1][1] == (0, len(prompts))  # the last request's, in a plan of no rows
    assert any(c[0] == "restore" for c in copies)
