"""The weight threads' staging rings on CUDA: registered (page-locked) host buffers, the tensors decoded
through them equal the file's, and closing the ring unlocks its pages; a refused registration
falls back to torch's pinned allocation (tests/runtime/test_registered_staging.py on the CPU)."""

from __future__ import annotations

import io

import pytest
import torch
from safetensors.torch import save as save_safetensors

from helios.runtime.loading.weight_stream import RegisteredHost, StagedCopier, WantedTensor, load_safetensors_stream

pytestmark = pytest.mark.gpu


def test_tensors_staged_through_registered_buffers_equal_the_file_and_close_unlocks():
    generator = torch.Generator().manual_seed(3)
    tensors = {"w.big": torch.randn(3000, 7, generator=generator).to(torch.bfloat16),  # spans several slots
               "w.small": torch.arange(5, dtype=torch.int32)}
    data = save_safetensors(tensors)
    copier = StagedCopier(torch.device("cuda"), slot_nbytes=8192, num_slots=2)
    assert all(slot.data_ptr() % RegisteredHost.PAGE == 0 for slot in copier._slots)
    assert all(_registered(slot) for slot in copier._slots)
    wanted = {name: WantedTensor(t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    loaded = load_safetensors_stream(io.BytesIO(data), len(data), "weights.part0", wanted, copier)
    copier.close()
    assert not any(_registered(slot) for slot in copier._slots)
    for name, tensor in tensors.items():
        assert loaded[name].device.type == "cuda" and torch.equal(loaded[name].cpu(), tensor)


def _registered(buffer: torch.Tensor) -> bool:
    """Whether the driver holds `buffer`'s pages registered (torch's is_pinned knows only its own pinned
    allocations): registering them again is refused as already registered, else it succeeds and is undone."""
    cudart = torch.cuda.cudart()
    error = cudart.cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
    if error == cudart.cudaError.success:
        cudart.cudaHostUnregister(buffer.data_ptr())
        return False
    return True


def test_a_refused_registration_stages_through_pinned_memory(monkeypatch):
    cudart = torch.cuda.cudart()

    class Refusing:
        cudaError = cudart.cudaError  # noqa: N815

        def cudaHostRegister(self, *args):  # noqa: N802
            return 2  # cudaErrorMemoryAllocation (the binding names only success)

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Refusing())
    host = RegisteredHost(1 << 16)
    assert host.tensor.is_pinned() and host.tensor.numel() == 1 << 16
    host.close()  # nothing registered: nothing to unlock
