"""Self-contained plans: a request's spec crosses once (its first plan), rows then carry only what
changed, and its id comes back once in `finished` after the last plan naming it; a packer that
applies the plans - rank zero's, or a tensor-parallel peer's that reads them off the wire - holds
exactly the requests the scheduler has announced and not yet released."""

from __future__ import annotations

from types import SimpleNamespace

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.packer import Packer
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.parallel.rank_wire import MessageKind, StepMessage, WireDecoder, WireEncoder
from helios.runtime.records.sampling_params import SamplingParams

from .harness import make, spec


def record_packer() -> Packer:
    """A packer of a model without programs: what `apply` keeps is all there is to it."""
    prepared = SimpleNamespace(graphs={}, graphs_for=lambda operation: (), contract=SimpleNamespace(
        model=SimpleNamespace(vocabulary=spb.VocabularyContract())),
        manifest=SimpleNamespace(completion=SimpleNamespace(submission_input="")))
    return Packer(prepared, {})


def run_preempting(policy: SchedulerPolicy = SchedulerPolicy()):
    """Three requests on six pages (one is preempted and readmitted); the driver and its plans."""
    scheduler, driver = make(policy, max_active=4, num_pages=6)
    sampled = SamplingParams(temperature=0.5, top_k=3, seed=-7)
    specs = (spec("a", range(1, 9), 6), spec("b", range(20, 26), 6, sampling=sampled),
             spec("c", range(40, 46), 6, logit_bias=((3, 1.5),)))
    driver.submit(*specs)
    driver.run()
    assert scheduler.counters().preemptions > 0
    driver.specs = {s.request_id: s for s in specs}
    return driver


def test_a_spec_crosses_once_and_its_id_finishes_once_after_its_last_row():
    driver = run_preempting()
    plans = driver.plans
    for request_id in "abc":
        named = [index for index, plan in enumerate(plans) if any(r.request_id == request_id for r in plan.rows)]
        admitted = [index for index, plan in enumerate(plans) for s in plan.admitted if s.request_id == request_id]
        finished = [index for index, plan in enumerate(plans) if request_id in plan.finished]
        assert admitted == [named[0]], request_id  # once, in its first plan, even though one was readmitted
        assert len(finished) <= 1 and all(index > named[-1] for index in finished), request_id
        assert [s for s in plans[admitted[0]].admitted if s.request_id == request_id] == [driver.specs[request_id]]
    released = [rid for plan in plans for rid in plan.finished]
    assert len(released) == len(set(released))


def test_rows_carry_only_new_tokens_and_new_pages():
    driver = run_preempting()
    history = {rid: list(spec_.prompt_ids) + driver.outcomes[rid].tokens
               for plan in driver.plans for spec_ in plan.admitted for rid in [spec_.request_id]}
    frontier: dict[tuple[str, int], int] = {}
    pages: dict[tuple[str, int], list[int]] = {}
    for plan in driver.plans:
        for row in plan.rows:
            key = (row.request_id, row.generation)
            if row.admits:
                assert key not in frontier
                frontier[key], pages[key] = row.start_pos, []
            assert row.start_pos == frontier[key], "a row re-sent or skipped history"
            frontier[key] += row.query_len
            if not row.pending_on_device:
                assert list(row.token_ids) == history[row.request_id][row.start_pos:row.start_pos + len(row.token_ids)]
            assert row.page_table_start == len(pages[key]), "page-table entries sent twice"
            pages[key] += row.new_page_ids
    assert {rid for rid, _ in frontier} == {"a", "b", "c"}
    assert len(frontier) > 3  # the preempted request came back in a new slot generation (no new spec)


def test_a_peer_rebuilds_rank_zeros_records_from_the_wire():
    driver = run_preempting(SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    zero, peer = record_packer(), record_packer()
    encoder, decoder = WireEncoder(), WireDecoder()
    held = {}
    for plan in driver.plans:
        received = decoder.decode(encoder.encode(StepMessage(MessageKind.LAUNCH, plan))).plan
        assert received == plan._replace(masks={})
        zero.apply(plan)
        peer.apply(received)
        assert zero._requests == peer._requests and zero._requests.keys() == peer._requests.keys()
        for row in plan.rows:  # every row names a request its packer holds, with the spec it was sent
            assert peer.spec(row.request_id) == zero.spec(row.request_id) is not None
            held[row.request_id] = peer.spec(row.request_id)
    assert held == driver.specs  # sampling parameters, signed seed and logit bias included
    # The last releases ride on the next plan: an idle scheduler's next plan drops them everywhere.
    driver.submit(spec("d", (5, 6, 7), 2))
    driver.run()
    for plan in driver.plans[-3:]:
        received = decoder.decode(encoder.encode(StepMessage(MessageKind.STEP, plan))).plan
        zero.apply(plan)
        peer.apply(received)
    assert {"a", "b", "c"}.isdisjoint(peer._requests) and zero._requests == peer._requests


def test_a_failed_plan_sends_its_finished_ids_again():
    scheduler, driver = make(max_active=4, num_pages=16)
    driver.submit(spec("a", (1, 2, 3), 2))
    driver.run()
    driver.submit(spec("b", (4, 5, 6), 2))
    first = scheduler.schedule()
    assert first.finished == ("a",) and [s.request_id for s in first.admitted] == ["b"]
    scheduler.fail(first, "lost before it reached the packers")
    driver.submit(spec("c", (7, 8, 9), 2))
    again = scheduler.schedule()
    assert "a" in again.finished and "b" in again.finished  # b ended with the failed plan
    assert [s.request_id for s in again.admitted] == ["c"]
