"""The collective ABI ops and the cohort agreement, on two gloo ranks that are threads of this
process (each rank creates its own process group; that is all gloo needs)."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from helios.abi import collectives
from helios.abi.collectives import CollectiveError, GroupCollectives, bind_collectives
from helios.abi.registry import AbiArgumentError
from helios.contract import manifest_pb2 as mpb
from helios.runtime.parallel.rank_rendezvous import Rendezvous
from helios.runtime.parallel.ranks import CohortRejected, agree

TIMEOUT = timedelta(seconds=2)


def on_ranks(work, ranks: int = 2, timeout: timedelta = TIMEOUT) -> list:
    """work(rank, group) on every rank at once (one thread each); returns results or exceptions."""
    rendezvous, results = Rendezvous.in_process(), [None] * ranks

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank, rendezvous.form_group(rank, ranks, timeout))
        except Exception as error:  # noqa: BLE001 - returned for the test to inspect
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_ops_combine_every_rank_and_agree_bit_for_bit():
    def work(rank, group):
        x = torch.tensor([[1.5, -2.0], [0.25, 3.0]]) * (rank + 1)
        ops = GroupCollectives(group)
        return ops.all_reduce(x, 2), ops.all_gather(x, 2), ops.broadcast(x, 2, 1), x

    (reduced0, gathered0, broadcast0, x0), (reduced1, gathered1, broadcast1, x1) = on_ranks(work)
    assert torch.equal(reduced0, x0 + x1) and torch.equal(reduced1, reduced0)
    assert torch.equal(gathered0, torch.stack([x0, x1])) and torch.equal(gathered1, gathered0)
    assert torch.equal(broadcast0, x1) and torch.equal(broadcast1, x1)
    assert torch.equal(x0, torch.tensor([[1.5, -2.0], [0.25, 3.0]]))  # inputs are not modified


def test_a_program_needs_a_bound_group_of_its_rank_count():
    with pytest.raises(CollectiveError, match="no rank group"):
        torch.ops.helios.all_reduce(torch.ones(2), 2)

    def work(rank, group):
        GroupCollectives(group).all_reduce(torch.ones(2), 4)

    assert all(isinstance(result, AbiArgumentError) for result in on_ranks(work))


def test_binding_points_a_program_graph_at_its_group():
    """`bind_collectives` rewrites a program's collective calls (the registered op or the body a
    CPU program calls) to take its rank's group explicitly; unbound, the op refuses to run."""

    def program(x):
        return torch.ops.helios.all_reduce.default(x * 2, 2), torch.ops.helios.broadcast.default(x, 2, 1)

    def bodies() -> torch.fx.GraphModule:  # a CPU program calls op bodies directly (`bind_abi_kernels`)
        graph = torch.fx.Graph()
        graph.output(graph.call_function(collectives.all_gather.body, (graph.placeholder("x"), 2)))
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    # Built before the ranks start: a rank still tracing would keep the other waiting in a collective.
    modules = [(torch.fx.symbolic_trace(program), bodies()) for _ in range(2)]
    with pytest.raises(CollectiveError, match="no rank group"):
        modules[0][0](torch.ones(2))

    def work(rank, group):
        module, gather = modules[rank]
        bound = bind_collectives(module.graph, group), bind_collectives(gather.graph, group)
        module.recompile()
        gather.recompile()
        x = torch.full((2,), float(rank + 1))
        return bound, module(x), gather(x)

    (bound, (reduced, broadcast), gathered), (_, (reduced1, _), _) = on_ranks(work)
    assert bound == (2, 1)
    assert torch.equal(reduced, torch.full((2,), 6.0)) and torch.equal(reduced1, reduced)
    assert torch.equal(broadcast, torch.full((2,), 2.0))
    assert torch.equal(gathered, torch.tensor([[1.0, 1.0], [2.0, 2.0]]))


def test_a_rank_that_does_not_answer_fails_the_collective():
    def work(rank, group):
        if rank == 1:
            return None  # never joins the all_reduce
        return GroupCollectives(group).all_reduce(torch.ones(2), 2)

    silent_peer = on_ranks(work, timeout=timedelta(seconds=1))
    assert isinstance(silent_peer[0], CollectiveError) and "rank 0 of 2" in str(silent_peer[0])


def fake_executor(record: list[int]):
    """What `agree` reads of an executor: the completion buffer (frame 0 holds `record`)."""
    completion = torch.zeros((2, 1, 8 * len(record)), dtype=torch.uint8)
    completion[0].view(torch.int64)[0] = torch.tensor(record)
    manifest = mpb.ExecutionManifest()
    manifest.completion.buffer = "completion"
    prepared = SimpleNamespace(manifest=manifest)
    return SimpleNamespace(model=SimpleNamespace(buffers={"completion": completion}, prepared=prepared))


PLAN = SimpleNamespace(frame=0, sequence=7, variant="program")


def test_ranks_agree_on_equal_records():
    assert on_ranks(lambda rank, group: agree(group, fake_executor([1, 2, 3]), PLAN, None)) == [None, None]


def test_a_rejecting_rank_fails_the_cohort_on_every_rank():
    def work(rank, group):
        error = ValueError("token 999 is outside the vocabulary") if rank == 1 else None
        agree(group, fake_executor([1, 2, 3]), PLAN, error)

    results = on_ranks(work)
    assert all(isinstance(result, CohortRejected) for result in results)
    assert all("rank 1 rejected submission 7: ValueError: token 999" in str(result) for result in results)


def test_differing_records_fail_the_cohort_on_every_rank():
    results = on_ranks(lambda rank, group: agree(group, fake_executor([1, 2, 3 + rank]), PLAN, None))
    assert all(isinstance(result, CohortRejected) and "differs from rank 0" in str(result) for result in results)
