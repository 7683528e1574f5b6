"""A rank that joins later than the collective timeout after the first ready rank still joins: rank zero
waits `join_timeout_s` for every rank, but a ready peer went straight on to form the group, which waits
only the collective timeout for the others, so it gave up and took startup down ("rank 1 (thread)
ended: ... could not form the group of 4"). Peers now form the group once rank zero saw every rank
ready. Rank zero's local peers here are threads beside ranks that join over TCP: the threads shared
rank zero's store client, whose connection gloo's group formation holds while it waits, so two ranks of
one process never formed the group (every startup failed after the collective timeout); each thread now
has a client of its own. When rank zero gives up starting, the ranks that wait for the others leave."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import transformers

from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions, join_rank
from helios.runtime.parallel.rank_rendezvous import RankJoinError, Rendezvous
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import QWEN3_MOE, Family

from .conftest import MAX_TOKENS, PROMPTS, greedy_tokens
from .test_generate_cli import free_port

HANG_GUARD_S = 120
# Four key/value heads: a core of four ranks (the shared families' tiny checkpoints have two).
QWEN3_TP4 = Family("qwen3_tp4", transformers.Qwen3Config, (("head_dim", 16), ("num_key_value_heads", 4),
                                                           ("tie_word_embeddings", False)))
COLLECTIVE_TIMEOUT_S = 5.0


def test_ranks_that_join_after_the_collective_timeout_join_threads_of_rank_zero(cores):
    path = cores.core(QWEN3_TP4, 4)
    expected = greedy_tokens(cores.open(path))  # all four ranks threads of this process
    address = f"127.0.0.1:{free_port()}"
    options = RankOptions(peers=PeerKind.THREADS, local_ranks=2, rendezvous=address,
                          collective_timeout_s=COLLECTIVE_TIMEOUT_S, join_timeout_s=HANG_GUARD_S)
    zero, outcome = _rank_zero_with_rank_one_ready(cores, path, options, address)
    time.sleep(COLLECTIVE_TIMEOUT_S + 1.0)  # the remote ranks come later than rank 1's collective timeout
    errors: list = []

    def remote(rank: int) -> None:
        try:
            join_rank(cores.open(path), Rendezvous.join(address, timedelta(seconds=HANG_GUARD_S)), rank)
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    remotes = [threading.Thread(target=remote, args=(rank,), daemon=True) for rank in (2, 3)]
    for thread in remotes:
        thread.start()
    zero.join(HANG_GUARD_S)
    (runtime,) = outcome
    assert not isinstance(runtime, Exception), runtime
    try:
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    finally:
        runtime.close()  # the remote ranks leave once rank zero stops the group
    for thread in remotes:
        thread.join(HANG_GUARD_S)
    assert not errors, errors
    assert [list(r.token_ids) for r in results] == expected


def test_ranks_waiting_for_the_others_leave_when_rank_zero_gives_up(cores):
    """Rank 1 (a thread of rank zero) is ready and waits for ranks 2 and 3; rank 2 brings another core and
    refuses, so rank zero gives up: rank 1 leaves at once, not after its join timeout."""
    path = cores.core(QWEN3_TP4, 4)
    address = f"127.0.0.1:{free_port()}"
    options = RankOptions(peers=PeerKind.THREADS, local_ranks=2, rendezvous=address,
                          collective_timeout_s=COLLECTIVE_TIMEOUT_S, join_timeout_s=3600.0)
    zero, outcome = _rank_zero_with_rank_one_ready(cores, path, options, address)
    with pytest.raises(RankJoinError, match="prepared for 2 ranks"):
        join_rank(cores.open(cores.core(QWEN3_MOE, 2)), Rendezvous.join(address, timedelta(seconds=HANG_GUARD_S)), 2)
    zero.join(HANG_GUARD_S)
    (error,) = outcome
    assert isinstance(error, RankJoinError) and "rank 2 refused to join" in str(error), error
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard, far below rank 1's join timeout (an hour)
    while any(thread.name == "helios-rank-1" for thread in threading.enumerate()):
        assert time.monotonic() < deadline, "rank 1 still waits for the ranks of a group rank zero gave up"
        time.sleep(0.05)


def _rank_zero_with_rank_one_ready(cores, path, options: RankOptions, address: str) -> tuple[threading.Thread, list]:
    """Rank zero loading on a thread of this process (its outcome, a runtime or an error, in the list),
    returned once rank 1, a thread of rank zero, is ready."""
    outcome: list = []

    def rank_zero() -> None:
        try:
            outcome.append(build_runtime(cores.open(path), RuntimeOptions(ranks=options)))
        except Exception as error:  # noqa: BLE001 - the caller checks it
            outcome.append(error)

    zero = threading.Thread(target=rank_zero, daemon=True)
    zero.start()
    watcher = Rendezvous.join(address, timedelta(seconds=HANG_GUARD_S))
    deadline = time.monotonic() + HANG_GUARD_S
    while not watcher.store.check(["helios/ready/1"]):
        assert zero.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    return zero, outcome
