"""Placement of tensor-parallel ranks on devices, backend selection and the refusals that need no
GPU to check: more local ranks than visible GPUs, rank threads on CUDA, a joining rank whose device
does not fit rank zero's backend, host-blocking NCCL settings."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from helios.contract import StartupOptions
from helios.errors import LoadError
from helios.runtime.parallel.rank_devices import (
    MissingDeviceError,
    RankBackend,
    UnsupportedRanksError,
    backend_for,
    check_nccl_environment,
    join_device,
    place_local_ranks,
)
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions, join_rank, start_ranks
from helios.runtime.parallel.rank_rendezvous import Launch, RankIdentity, RankJoinError, Rendezvous
from helios.runtime.records.stats import WorkerStats

CUDA = [torch.device("cuda", index) for index in range(4)]


@pytest.mark.parametrize("device, backend", [
    ("cpu", RankBackend.GLOO), ("cuda", RankBackend.NCCL), ("cuda:1", RankBackend.NCCL),
])
def test_the_device_type_picks_the_backend(device, backend):
    assert backend_for(device) is backend
    assert backend_for(torch.device(device)) is backend


def test_a_device_without_a_backend_is_refused():
    with pytest.raises(UnsupportedRanksError, match="not on meta"):
        backend_for("meta")


@pytest.mark.parametrize("device, local, visible, expected", [
    ("cuda", 2, 2, CUDA[:2]),  # "cuda" means base 0
    ("cuda:0", 2, 8, CUDA[:2]),
    ("cuda:1", 3, 4, CUDA[1:4]),  # rank r on cuda:(B + r)
    ("cuda:3", 1, 4, CUDA[3:4]),
])
def test_local_rank_r_runs_on_the_base_gpu_plus_r(device, local, visible, expected):
    placement = place_local_ranks(device, local, threads=False, visible_gpus=visible)
    assert placement.backend is RankBackend.NCCL
    assert placement.devices == tuple(expected)


def test_cpu_ranks_all_run_on_the_cpu_as_threads_or_processes():
    for threads in (False, True):
        placement = place_local_ranks("cpu", 4, threads=threads, visible_gpus=0)
        assert placement.backend is RankBackend.GLOO
        assert placement.devices == (torch.device("cpu"),) * 4


@pytest.mark.parametrize("device, local, visible", [("cuda", 3, 2), ("cuda:1", 2, 2), ("cuda", 2, 0)])
def test_more_local_ranks_than_visible_gpus_is_a_load_error(device, local, visible):
    with pytest.raises(MissingDeviceError, match=f"{visible} GPU\\(s\\) are visible") as caught:
        place_local_ranks(device, local, threads=False, visible_gpus=visible)
    assert isinstance(caught.value, LoadError)
    assert f"cuda:{(torch.device(device).index or 0) + local - 1}" in str(caught.value)


def test_rank_threads_are_refused_on_cuda():
    with pytest.raises(UnsupportedRanksError, match="run as processes"):
        place_local_ranks("cuda", 2, threads=True, visible_gpus=2)
    assert place_local_ranks("cuda", 1, threads=True, visible_gpus=1).devices == (CUDA[0],)  # no peer threads


@pytest.mark.parametrize("backend, device, expected", [
    (RankBackend.GLOO, None, torch.device("cpu")),
    (RankBackend.NCCL, None, CUDA[0]),
    (RankBackend.NCCL, "cuda", CUDA[0]),
    (RankBackend.NCCL, "cuda:3", CUDA[3]),
    (RankBackend.GLOO, "cpu", torch.device("cpu")),
])
def test_a_joining_rank_takes_its_own_device_or_the_backends_default(backend, device, expected):
    assert join_device(backend, device, visible_gpus=4) == expected


def test_a_joining_rank_needs_its_gpu_to_be_visible():
    with pytest.raises(MissingDeviceError, match="cuda:2 is not one of the 2 visible GPU"):
        join_device(RankBackend.NCCL, "cuda:2", visible_gpus=2)
    with pytest.raises(MissingDeviceError, match="cuda:0 is not one of the 0 visible GPU"):
        join_device(RankBackend.NCCL, None, visible_gpus=0)


@pytest.mark.parametrize("backend, device", [(RankBackend.NCCL, "cpu"), (RankBackend.GLOO, "cuda:0")])
def test_a_joining_device_of_the_other_kind_is_refused(backend, device):
    with pytest.raises(UnsupportedRanksError, match=f"rank zero runs a {backend.value} group"):
        join_device(backend, device, visible_gpus=4)


def test_blocking_nccl_waits_are_refused():
    with pytest.raises(UnsupportedRanksError, match="TORCH_NCCL_BLOCKING_WAIT"):
        check_nccl_environment({"TORCH_NCCL_BLOCKING_WAIT": "1"})
    check_nccl_environment({"TORCH_NCCL_BLOCKING_WAIT": "0"})
    check_nccl_environment({})


def launch(backend: RankBackend, cuda_graphs: bool = False) -> Launch:
    identity = RankIdentity(2, "cache-identity", "digest", "wire")
    return Launch(identity, StartupOptions(), 0, 2, 5.0, backend.value, cuda_graphs, 30.0)


def test_the_launch_carries_the_backend_and_the_capture_choice():
    original = launch(RankBackend.NCCL, cuda_graphs=True)
    assert Launch.decode(original.encode()) == original


def test_a_rank_whose_device_does_not_fit_the_backend_is_refused_and_rank_zero_learns_why():
    rendezvous = Rendezvous.in_process()
    rendezvous.publish(launch(RankBackend.GLOO))
    with pytest.raises(UnsupportedRanksError, match="rank zero runs a gloo group"):
        join_rank(None, rendezvous, 1, "cuda:0", timedelta(seconds=5))  # refused before it loads
    with pytest.raises(RankJoinError, match="rank 1 refused to join: rank zero runs a gloo group"):
        rendezvous.wait_ready(range(1, 2), 5.0, lambda: None)


def cuda_executor(ranks: int = 2):
    """What `start_ranks` reads of rank zero's executor before it starts any peer."""
    manifest = SimpleNamespace(ranks=ranks)
    return SimpleNamespace(model=SimpleNamespace(device=CUDA[0], prepared=SimpleNamespace(manifest=manifest)))


def test_a_cuda_model_needs_one_visible_gpu_per_local_rank():
    """The former refusal ("CPU only") is gone: a CUDA model is placed; on this host there are no
    GPUs for its ranks, which is a LoadError naming them (the GPU tests run it where there are)."""
    visible = torch.cuda.device_count()
    ranks = visible + 1
    with pytest.raises(MissingDeviceError, match=f"need cuda:0 .. cuda:{ranks - 1}, but {visible} GPU"):
        start_ranks(None, cuda_executor(ranks), WorkerStats(), RankOptions(), host_pages=0)


def test_rank_threads_of_a_cuda_model_are_refused_at_start():
    with pytest.raises(UnsupportedRanksError, match="run as processes"):
        start_ranks(None, cuda_executor(), WorkerStats(), RankOptions(peers=PeerKind.THREADS), host_pages=0)
