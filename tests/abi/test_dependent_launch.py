"""`helios.abi.dependent_launch`: which launches take programmatic dependent launch. The kernels'
PDL variants are compiled for sm_90 in `compile_fused_kernels.py`; on a device, the same bits with
and without it (`tests/gpu/test_skinny_cuda.py`)."""

from __future__ import annotations

import torch

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from helios.abi import dependent_launch, triton_skinny


def test_cpu_tensors_never_take_it():
    assert not dependent_launch.dependent_launch(torch.zeros(2))


def test_disabled_takes_none(monkeypatch):
    monkeypatch.setattr(dependent_launch, "ENABLED", False)
    assert not dependent_launch.dependent_launch(torch.zeros(2))


def test_no_prefetch_without_it():
    x = torch.zeros(2)
    assert triton_skinny._dependent(x, None, None) == (False, 0)
    assert triton_skinny._dependent(x, True, None) == (True, dependent_launch.PREFETCH_COLUMNS)
    assert triton_skinny._dependent(x, False, 512) == (False, 0)
    assert triton_skinny._dependent(x, True, 512) == (True, 512)


def test_decode_launches_take_it_up_to_64_tokens_where_the_device_allows(monkeypatch):
    from helios.abi import triton_decode

    monkeypatch.setattr(triton_decode, "dependent_launch", lambda tensor: True)  # a Hopper device
    assert triton_decode.takes_dependent_launch(torch.zeros(1, 32, 128))
    assert triton_decode.takes_dependent_launch(torch.zeros(triton_decode.PDL_MAX_TOKENS, 32, 128))
    assert not triton_decode.takes_dependent_launch(torch.zeros(triton_decode.PDL_MAX_TOKENS + 1, 32, 128))
    monkeypatch.setattr(triton_decode, "dependent_launch", dependent_launch.dependent_launch)
    assert not triton_decode.takes_dependent_launch(torch.zeros(1, 32, 128))  # CPU tensors never take it
