"""Preemption: victim choice, what is kept and freed, readmission by recompute or restore."""

from __future__ import annotations

from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.records.request import RequestStatus

from .fake_model import reference
from .harness import assert_all_released, make, spec

PAGE, HOST = StorageKind.PAGE, StorageKind.HOST


def full_cache(policy=SchedulerPolicy(), priorities=(0, 0, 0)):
    """Six pages, all referenced: a (8 prompt tokens) needs a seventh at its first decode."""
    scheduler, driver = make(policy, max_active=4, num_pages=6)
    prompts = {"a": list(range(1, 9)), "b": list(range(20, 26)), "c": list(range(40, 46))}
    driver.submit(*(spec(name, prompt, 6, priority=p) for (name, prompt), p in zip(prompts.items(), priorities)))
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    assert scheduler.cache.pool.num_available == 0
    return scheduler, driver, prompts


def test_victim_is_the_latest_submitted_among_equal_priorities():
    scheduler, driver, prompts = full_cache()
    c_pages = list(scheduler.queues.requests["c"].page_ids)
    plan = scheduler.schedule()
    scheduler.check_invariants()
    assert [r.request_id for r in plan.rows] == ["a", "b"]
    c = scheduler.view("c")
    assert c.status == RequestStatus.WAITING and c.slot == -1 and c.num_preemptions == 1
    assert c.output_ids == tuple(driver.outcomes["c"].tokens)  # generated tokens are kept for recompute
    pool = scheduler.cache.pool
    assert pool.cache.parked_pages() == [c_pages[0]]  # its complete page stays cached
    assert plan.rows[0].new_page_ids == (c_pages[1],)  # its partial page went to a
    assert scheduler.counters().preemptions == 1


def test_victim_is_the_lowest_priority_first():
    scheduler, driver, _ = full_cache(priorities=(0, 5, 0))
    plan = scheduler.schedule()
    assert [r.request_id for r in plan.rows] == ["a", "c"]
    assert scheduler.view("b").status == RequestStatus.WAITING


def test_a_lane_that_is_itself_the_lowest_priority_preempts_itself():
    scheduler, driver, _ = full_cache(priorities=(9, 0, 0))
    plan = scheduler.schedule()
    assert [r.request_id for r in plan.rows] == ["b", "c"]
    assert scheduler.view("a").status == RequestStatus.WAITING and scheduler.view("b").num_preemptions == 0


def test_readmission_recomputes_prompt_and_generated_tokens():
    scheduler, driver, prompts = full_cache()
    driver.step()  # schedules a and b, preempting c
    assert scheduler.view("c").status == RequestStatus.WAITING
    driver.run()
    readmitted = [r for p in driver.plans for r in p.rows if r.request_id == "c" and r.admits]
    assert readmitted, "c was never readmitted"
    row = readmitted[-1]
    assert row.generation > 1 and row.page_table_start == 0
    first_output = reference(prompts["c"], 6)[0]
    assert row.token_ids[-1] == first_output  # the recomputed tail ends with c's generated token
    assert row.start_pos + row.query_len == len(prompts["c"]) + 1
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 6), name
    assert_all_released(scheduler)


def test_offload_preemption_checkpoints_to_host_and_waits_for_the_fence():
    scheduler, driver, prompts = full_cache(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    c_pages = list(scheduler.queues.requests["c"].page_ids)
    plan = scheduler.schedule()
    assert [r.request_id for r in plan.rows] == ["b"]  # a waits: c's pages return at this fence
    assert plan.copies == (CopyOp(Location(PAGE, c_pages[0]), Location(HOST, 0), 4),
                           CopyOp(Location(PAGE, c_pages[1]), Location(HOST, 1), 2))
    allocator = scheduler.cache.pool.allocator
    assert [allocator.ref_count(p) for p in c_pages] == [1, 1]  # held by the checkpoint until the fence
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    scheduler.check_invariants()
    assert [allocator.ref_count(p) for p in c_pages] == [0, 0]
    driver.run()
    restore = [p for p in driver.plans if any(c.dst.kind == PAGE for c in p.copies)]
    assert restore, "c was not restored from the host"
    row = [r for r in restore[0].rows if r.request_id == "c"][0]
    assert row.start_pos == 6 and row.token_ids == (driver.outcomes["c"].tokens[0],)
    for name, prompt in prompts.items():
        assert driver.outcomes[name].tokens == reference(prompt, 6), name
    assert_all_released(scheduler)


def test_failed_checkpoint_falls_back_to_recompute():
    scheduler, driver, prompts = full_cache(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    plan = scheduler.schedule()
    driver.record(scheduler.fail(plan, "copy engine fault"))
    assert driver.outcomes["b"].finish.reason.name == "ERROR"
    assert scheduler.cache.snapshots.snapshots() == []
    driver.run()
    for name in ("a", "c"):
        assert driver.outcomes[name].tokens == reference(prompts[name], 6), name
    assert_all_released(scheduler)
