"""Engram host staging: an Engram core (a hashed n-gram table in host memory, staged per step) loads,
serves and equals the plain reference computation; the hash matches the specification; a frame is
never overwritten while any rank's consumer is unretired (one rank, and two gloo ranks)."""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest
import torch

from helios.runtime.execution.host_staging import (FrameInUseError, GroupRetirement, HostStaging, HostTable, LocalRetirement)
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_rendezvous import Rendezvous
from helios.runtime.parallel.ranks import retire_over_group
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import KEY, NAMESPACE, open_fixture
from support.engram_core import EngramModel, reference_tokens, write_engram_core

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [40, 41], [7]]


@pytest.fixture(scope="module")
def engram(tmp_path_factory):
    fixture = open_fixture()
    model = EngramModel.random(fixture.prepared.sampled_range[1])
    path = write_engram_core(fixture, model, KEY, NAMESPACE, tmp_path_factory.mktemp("engram") / "engram.core")
    return model, path


def test_an_engram_core_serves_the_reference_tokens_alone_and_batched(engram):
    model, path = engram
    runtime = build_runtime(open_fixture(path))
    assert runtime.model.weights["engram.table"].device.type == "cpu"
    expected = [reference_tokens(model, prompt, 12) for prompt in PROMPTS]
    assert [list(r.token_ids) for r in generate(runtime.engine, PROMPTS[:1], 12)] == expected[:1]
    batched = generate(runtime.engine, PROMPTS, 12)
    assert [list(r.token_ids) for r in batched] == expected


def test_the_staged_rows_are_the_hash_of_the_specification():
    model = EngramModel.random(97, rows=101, heads=3, ngram_tokens=4)
    table = _table(model)
    tokens = [5, 96, 0, 17, 17, 3, 80]
    ids = table.row_ids(tokens, 2, 5)
    assert ids.tolist() == [model.rows_at(tokens, p) for p in range(2, 7)]


def _table(model: EngramModel) -> HostTable:
    multipliers = np.array(model.multipliers, dtype=np.uint64).reshape(model.heads, model.ngram_tokens)
    return HostTable("t", model.ngram_tokens, multipliers, model.table)


def _staging(model: EngramModel, retirement=None) -> HostStaging:
    return HostStaging({"t": _table(model)}, {"t": 8}, retirement)


def test_each_execution_frame_has_its_own_host_frame_reused_only_after_retirement():
    model = EngramModel.random(97)
    staging = _staging(model)
    first = staging.stage("t", 0, 10, [([1, 2, 3], 0, 3)])
    kept = first.clone()
    second = staging.stage("t", 1, 11, [([4, 5], 0, 2)])
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first[:3].reshape(3, -1), model.table[_table(model).row_ids([1, 2, 3], 0, 3)].reshape(3, -1))
    assert first[3:].eq(0).all()
    with pytest.raises(FrameInUseError, match="submission 10"):
        staging.stage("t", 0, 12, [([9, 9], 0, 2)])  # submission 10 is not retired
    assert torch.equal(first, kept)  # refused before a byte was written
    staging.retire(10)
    again = staging.stage("t", 0, 12, [([9, 9], 0, 2)])
    assert again.data_ptr() == first.data_ptr() and not torch.equal(again, kept)
    assert staging.stage("t", 0, 12, []) is again  # a second destination of the same submission


def _on_ranks(work, ranks: int = 2) -> list:
    rendezvous, results = Rendezvous.in_process(), [None] * ranks

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank, rendezvous.form_group(rank, ranks, timedelta(seconds=5)))
        except Exception as error:  # noqa: BLE001 - returned for the test to inspect
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_under_tensor_parallelism_a_frame_waits_for_every_rank_to_retire_its_consumer():
    """Two gloo ranks stage the same submissions; rank 1 has not retired submission 0 when
    submission 2 needs frame 0 again, so neither rank overwrites it; once it has, both do."""
    model = EngramModel.random(97)

    def work(rank, group):
        staging = _staging(model, GroupRetirement(group.process_group))
        first = staging.stage("t", 0, 0, [([1, 2, 3], 0, 3)]).clone()
        staging.stage("t", 1, 1, [([4], 0, 1)])
        if rank == 0:  # submissions retire in order; rank 1's consumer of submission 0 still runs
            staging.retire(0)
            staging.retire(1)
        outcomes = []
        try:
            staging.stage("t", 0, 2, [([7, 7], 0, 2)])
            outcomes.append("staged")
        except FrameInUseError:
            outcomes.append("refused")
        outcomes.append(torch.equal(staging._frames["t"][0], first))
        staging.retire(0)
        staging.stage("t", 0, 2, [([7, 7], 0, 2)])
        outcomes.append(torch.equal(staging._frames["t"][0], first))
        return outcomes

    assert _on_ranks(work) == [["refused", True, False], ["refused", True, False]]


def test_tensor_parallel_executors_retire_over_their_group():
    class Executor:
        class packer:
            host_staging = _staging(EngramModel.random(97))

    def work(rank, group):
        executor = Executor() if rank == 0 else type("E", (), {"packer": type("P", (), {"host_staging": None})})()
        retire_over_group(executor, group)
        return executor.packer.host_staging

    staging, none = _on_ranks(work)
    assert isinstance(staging.retirement, GroupRetirement) and none is None
    assert isinstance(_staging(EngramModel.random(97)).retirement, LocalRetirement)


def test_a_two_rank_engram_core_serves_the_reference_tokens_with_cross_rank_retirement(engram, tmp_path):
    """Both ranks stage every submission's rows and reuse a frame only after the MIN all-reduce
    over the group says every rank retired it; the tokens are the reference's."""
    from helios.runtime.parallel.rank_peers import PeerKind, RankOptions
    from helios.runtime.service import RuntimeOptions

    model, _ = engram
    path = write_engram_core(open_fixture(), model, KEY, NAMESPACE, tmp_path / "engram-tp2.core", ranks=2)
    options = RankOptions(peers=PeerKind.THREADS, collective_timeout_s=10.0, join_timeout_s=60.0)
    runtime = build_runtime(open_fixture(path), RuntimeOptions(ranks=options))
    try:
        staging = runtime.engine.executor.packer.host_staging
        assert isinstance(staging.retirement, GroupRetirement)
        results = generate(runtime.engine, PROMPTS, 12)
        assert [list(r.token_ids) for r in results] == [reference_tokens(model, p, 12) for p in PROMPTS]
        assert staging.retirement.retired >= 2  # frames were reused across submissions
    finally:
        runtime.close()
