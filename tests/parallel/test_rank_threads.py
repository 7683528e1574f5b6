"""CPU ranks as local processes share the host's cores: each takes an equal share of rank zero's
intra-op threads unless the options name a count; CUDA ranks and thread peers keep theirs."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.parallel import rank_peers
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions

@pytest.fixture
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)

def test_local_cpu_rank_processes_split_rank_zeros_threads(threads):
    options, before = rank_peers._with_local_threads(RankOptions(), local=2, nccl=False)
    assert options.torch_threads == 2 and torch.get_num_threads() == 2  # rank zero takes its share too
    assert before == 4
    rank_peers._restore_threads(before)
    assert torch.get_num_threads() == 4
    assert rank_peers._with_local_threads(RankOptions(), local=8, nccl=False)[0].torch_threads == 1

def test_explicit_counts_cuda_ranks_and_thread_peers_keep_their_threads(threads):
    for options, local, nccl in ((RankOptions(torch_threads=3), 2, False), (RankOptions(), 2, True),
                                 (RankOptions(peers=PeerKind.THREADS), 2, False), (RankOptions(), 1, False)):
        assert rank_peers._with_local_threads(options, local, nccl) == (options, None)
        assert torch.get_num_threads() == 4


# Rank zero's share with a CPU rank process, and its threads back once its peers close: checked where a
# two-rank core serves with its rank as a process (tests/parallel/test_server.py), not on a process of its own.
