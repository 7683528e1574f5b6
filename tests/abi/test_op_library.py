"""ABI ops defined through `helios.abi.op_library`: registered as ``custom_op`` would register them
(body, device kernels, fake) without its dynamo-disable wrapper, so calling them never imports
torch._dynamo; schemas and mutated arguments must agree."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import helios.abi  # noqa: F401  (registers every op)
from helios.abi import rng, sampling
from helios.abi.op_library import AbiOp
from helios.abi.registry import cpu_body, registered_schemas


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


@pytest.mark.parametrize("name", sorted(registered_schemas()))
def test_every_op_has_its_body_a_fake_and_no_custom_op_layers(name):
    assert _has_kernel(name, "CompositeExplicitAutograd") and _has_kernel(name, "Meta")
    assert not _has_kernel(name, "Autograd") and not _has_kernel(name, "ADInplaceOrView")  # custom_op's
    assert cpu_body(name) is not None


def test_an_op_calls_through_the_dispatcher_and_keeps_its_body():
    seeds, counters = torch.arange(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    assert isinstance(rng.philox4x32, AbiOp) and rng.philox4x32.overload is torch.ops.helios.philox4x32.default
    assert torch.equal(rng.philox4x32(seeds, counters, 5), rng.philox4x32.body(seeds, counters, 5))
    assert rng.philox4x32.__name__ == "philox4x32" and rng.philox4x32.__doc__
    assert "cuda" in sampling.sample.kernels and cpu_body("helios::sample") is sampling.sample.body


_CALLS = """
import json, sys, torch
import helios.abi
seeds, counters = torch.arange(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
torch.ops.helios.philox4x32(seeds, counters, 1)
torch.ops.helios.silu_mul(torch.ones(2, 8))
torch.ops.helios.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-5)
print(json.dumps("torch._dynamo" in sys.modules))
"""


def test_calling_ops_imports_no_dynamo():
    """custom_op's wrapper imported torch._dynamo at the first call of any op (4-6.6 s on the GPU
    machine's host); a fresh process calls ops and finds it not imported."""
    done = subprocess.run([sys.executable, "-c", _CALLS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) is False


@pytest.mark.parametrize("schema, mutates, message", [
    ("(Tensor(a!) x, Tensor y) -> ()", (), r"mutates \['x'\], mutates_args names \[\]"),
    ("(Tensor x) -> Tensor", ("x",), r"mutates \[\], mutates_args names \['x'\]"),
])
def test_mutated_arguments_must_match_the_schema(schema, mutates, message):
    before = registered_schemas()
    with pytest.raises(ValueError, match=message):
        AbiOp("helios::test_only_mismatch", schema, mutates, lambda *a: None)
    assert registered_schemas() == before  # nothing defined


def test_names_and_devices_are_checked():
    with pytest.raises(ValueError, match="helios::NAME"):
        AbiOp("other::x", "(Tensor x) -> Tensor", (), lambda x: x)
    with pytest.raises(ValueError, match="kernels are for"):
        rng.philox4x32.register_kernel("tpu")
