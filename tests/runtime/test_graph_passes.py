"""Load-time removal of no-op nodes from exported programs (`helios.runtime.loading.graph_passes`)."""

from __future__ import annotations

import torch

from helios.runtime.loading.graph_passes import drop_no_op_nodes


class Casts(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        same = x.to(torch.float32) * 2  # float32 -> float32: a no-op
        wider = y.to(torch.float64)  # float32 -> float64: kept
        narrowed = (x + 1).to(torch.bfloat16)  # kept
        return same, wider, narrowed


def _targets(module) -> list:
    return [node.target for node in module.graph.nodes if node.op == "call_function"]


def test_same_dtype_conversions_and_their_checks_are_removed_and_the_results_are_unchanged():
    x, y = torch.randn(3, 4), torch.randn(5)
    module = torch.export.export(Casts(), (x, y), strict=False).module()
    before = module(x, y)
    conversions = _targets(module).count(torch.ops.aten.to.dtype)
    assert torch.ops.aten._assert_tensor_metadata.default in _targets(module)
    removed = drop_no_op_nodes(module)
    after = module(x, y)
    assert removed >= 2
    assert torch.ops.aten._assert_tensor_metadata.default not in _targets(module)
    assert _targets(module).count(torch.ops.aten.to.dtype) == conversions - 1  # the two real ones stay
    for got, want in zip(after, before):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert drop_no_op_nodes(module) == 0  # idempotent


_COPY_A_GRAPH = """
import copy, warnings, torch
import helios.runtime.loading  # its import installs the filter

class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y

module = torch.export.export(Add(), (torch.ones(2), torch.ones(2))).module()
with warnings.catch_warnings(record=True) as caught:  # the filters as they are; each shown again
    copy.deepcopy(module.graph)
    warnings.warn("a FutureWarning of another kind", FutureWarning)
print(repr([str(w.message) for w in caught]))
"""


def test_copying_a_programs_graph_warns_nothing():
    """Loading rewrites copies of programs' graphs; torch's copy of the graph's pytree specs raised a
    FutureWarning (`isinstance(treespec, LeafSpec)` is deprecated) that reached a served start's
    terminal. Importing the loading room silences that message only (in a fresh interpreter: pytest
    resets the warning filters around each test)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COPY_A_GRAPH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(["a FutureWarning of another kind"])
