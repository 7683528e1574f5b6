"""The weight threads' staging buffers: page-aligned host memory registered with the driver, unregistered
once the ring is closed; torch's pinned allocation where registering is refused (CPU, a fake runtime)."""

from __future__ import annotations

import io

import pytest
import torch

from helios.runtime.loading import weight_stream
from helios.runtime.loading.weight_stream import RegisteredHost, StagedCopier


class FakeRuntime:
    """`torch.cuda.cudart()`'s two calls, recorded; `refuse`: cudaHostRegister fails."""

    class cudaError:  # noqa: N801 - the runtime binding's name
        success = 0
        memoryAllocation = 2  # noqa: N815

    def __init__(self, refuse: bool = False):
        self.refuse, self.calls = refuse, []

    def cudaHostRegister(self, pointer, nbytes, flags):  # noqa: N802
        self.calls.append(("register", pointer, nbytes, flags))
        return self.cudaError.memoryAllocation if self.refuse else self.cudaError.success

    def cudaHostUnregister(self, pointer):  # noqa: N802
        self.calls.append(("unregister", pointer))
        return self.cudaError.success


def test_a_registered_buffer_is_page_aligned_registered_once_and_unregistered_once(monkeypatch):
    runtime = FakeRuntime()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime)
    host = RegisteredHost(3 * 4096 + 5)
    pointer = host.tensor.data_ptr()
    assert pointer % RegisteredHost.PAGE == 0 and host.tensor.numel() == 3 * 4096 + 5
    assert runtime.calls == [("register", pointer, 3 * 4096 + 5, 0)]
    host.tensor.fill_(7)  # the memory is the caller's to write
    host.close()
    host.close()
    assert runtime.calls[1:] == [("unregister", pointer)]


def test_a_refused_registration_allocates_pinned_and_never_unregisters(monkeypatch):
    runtime = FakeRuntime(refuse=True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime)
    pinned = []
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kwargs):
        pinned.append(pin_memory)
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(torch, "empty", empty)
    host = RegisteredHost(4096)
    assert pinned == [False, True] and host.tensor.numel() == 4096
    host.close()
    assert [call[0] for call in runtime.calls] == ["register"]


def test_no_runtime_bindings_falls_back_to_pinned(monkeypatch):
    def missing():
        raise AssertionError("Torch not compiled with CUDA enabled")
    monkeypatch.setattr(torch.cuda, "cudart", missing)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: "pinned" if pin_memory else real_empty(*a, **k))
    assert RegisteredHost(64).tensor == "pinned"


def test_loading_closes_every_ring_it_made(monkeypatch):
    closed = []
    monkeypatch.setattr(StagedCopier, "close", lambda self: closed.append(self))
    monkeypatch.setattr(weight_stream, "load_safetensors_stream", lambda *args: {})
    resources = {f"weights.part{i}": (8, {}) for i in range(4)}
    weight_stream.load_weight_resources(lambda _: io.BytesIO(), resources, torch.device("meta"), workers=3)  # rings of ordinary memory
    assert 1 <= len(closed) <= 3 and len({id(c) for c in closed}) == len(closed)


def test_a_failing_load_still_closes_its_rings(monkeypatch):
    closed = []
    monkeypatch.setattr(StagedCopier, "close", lambda self: closed.append(self))

    def fail(*args):
        raise weight_stream.WeightMismatchError("bad part")
    monkeypatch.setattr(weight_stream, "load_safetensors_stream", fail)
    with pytest.raises(weight_stream.WeightMismatchError):
        weight_stream.load_weight_resources(lambda _: io.BytesIO(), {"weights.part0": (8, {})},
                                            torch.device("meta"))
    assert len(closed) == 1
