"""The one-shot symmetric all-reduce behind ``helios::all_reduce``, checked without a GPU: which
tensors a group's reducer takes (small float32 / bf16 device tensors of whole 16-byte units) and
which go to NCCL or gloo, and that a CPU group is never offered one. tests/parallel/test_cuda.py
runs the real reducer on two GPUs."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from helios.abi.collectives import RankGroup, bind_group
from helios.abi.symmetric_reduce import SymmetricMemoryUnavailable, SymmetricReducer, open_symmetric_reducer
from helios.runtime.parallel.rank_rendezvous import Rendezvous

from .test_collectives import on_ranks
from .test_device_collectives import FakeDeviceGroup


class RecordingReducer(SymmetricReducer):
    def all_reduce(self, tensor):
        self.taken.append(tuple(tensor.shape))
        return tensor * 2


def reducer(device: str = "meta", max_bytes: int = 4096) -> RecordingReducer:
    buffers = {dtype: torch.empty(max_bytes // 2, dtype=dtype, device=device)
               for dtype in (torch.float32, torch.bfloat16)}
    made = RecordingReducer("helios-tp", buffers, max_bytes)
    object.__setattr__(made, "taken", [])
    return made


def test_the_reducer_takes_small_aligned_float_tensors_of_its_device():
    one = reducer()
    assert one.fits(torch.empty((4, 256), dtype=torch.bfloat16, device="meta"))  # 2 KiB
    assert one.fits(torch.empty(1024, dtype=torch.float32, device="meta"))  # 4 KiB: the limit
    assert not one.fits(torch.empty(1025 * 4, dtype=torch.float32, device="meta"))  # over the limit
    assert not one.fits(torch.empty((3, 257), dtype=torch.bfloat16, device="meta"))  # not 16-byte units
    assert not one.fits(torch.empty(64, dtype=torch.float16, device="meta"))  # no fp16 kernel
    assert not one.fits(torch.empty(64, dtype=torch.float32))  # another device
    assert not one.fits(torch.empty(0, dtype=torch.float32, device="meta"))


def test_a_group_with_a_reducer_sends_what_fits_there_and_the_rest_to_nccl():
    fake, taken = FakeDeviceGroup(), reducer()
    group = RankGroup(object(), 0, 2, timedelta(seconds=5), fake, taken)
    assert group.all_reduce_path == "symmetric"
    small = torch.empty((4, 256), dtype=torch.bfloat16, device="meta")
    large = torch.empty((64, 4096), dtype=torch.bfloat16, device="meta")
    group.all_reduced(small)  # what helios::all_reduce calls (meta tensors would reach its fake kernel)
    group.all_reduced(large)
    assert taken.taken == [(4, 256)]
    assert [call[0] for call in fake.calls if call[1] != "wait"] == ["allreduce"]
    assert RankGroup(object(), 0, 2, timedelta(seconds=5), fake).all_reduce_path == "nccl"


def test_cpu_tensors_never_take_the_reducer():
    def work(rank, group):
        with_reducer = RankGroup(group.process_group, rank, 2, group.timeout, None, reducer("cpu"))
        with bind_group(with_reducer):
            return torch.ops.helios.all_reduce(torch.full((4, 4), float(rank + 1)), 2), with_reducer.reducer.taken

    (zero, taken0), (one, taken1) = on_ranks(work)
    assert torch.equal(zero, torch.full((4, 4), 3.0)) and torch.equal(one, zero)
    assert taken0 == taken1 == []


def test_no_symmetric_memory_off_cuda():
    with pytest.raises(SymmetricMemoryUnavailable, match="not a CUDA device"):
        open_symmetric_reducer(None, "helios-tp", 0, 2, None, torch.device("cpu"))


def test_a_cpu_group_formed_with_the_symmetric_option_keeps_gloo():
    rendezvous = Rendezvous.in_process()

    def work(rank, group):
        return group.all_reduce_path, group.reducer

    results = on_ranks(lambda rank, _: work(rank, rendezvous.form_group(rank, 2, timedelta(seconds=5),
                                                                         torch.device("cpu"), symmetric=True)))
    assert results == [("gloo", None), ("gloo", None)]
