"""helios::paged_attention_tuned (the reference: paged_attention's result for any split count) and
helios::device_multiprocessors (the CPU's thread count), eagerly and under torch.export."""

from __future__ import annotations

import pytest
import torch

import helios.abi  # noqa: F401  (registers every op)
from helios.abi.attention import PAGED_ATTENTION_TUNED_SCHEMA
from helios.abi.registry import AbiArgumentError, registered_schemas
from helios.abi.tuning import DEVICE_MULTIPROCESSORS_SCHEMA

from test_attention import dense_reference, make_layout  # tests/abi is on sys.path (no package)


def tuned(layout, splits: torch.Tensor, window: int = 0) -> torch.Tensor:
    return torch.ops.helios.paged_attention_tuned(
        layout.q, layout.k_cache, layout.v_cache, layout.page_table, layout.query_start, layout.positions,
        0.3, window, splits)


@pytest.mark.parametrize("count", [1, 4, 0])
def test_tuned_attention_is_paged_attention_for_any_split_count(count):
    layout = make_layout(3, [1, 1, 4, 0], [9, 10, 5, 3], 2, 2, 4, padding=1)  # decode rows of 3 pages
    out = tuned(layout, torch.tensor([count], dtype=torch.int32), window=3)
    torch.testing.assert_close(out, dense_reference(layout, 0.3, 3), rtol=1e-5, atol=1e-5)


def test_tuned_attention_checks_its_split_tensor():
    layout = make_layout(4, [1, 1], [3, 4], 1, 2, 4, padding=0)
    with pytest.raises(AbiArgumentError, match="splits"):
        tuned(layout, torch.tensor([2], dtype=torch.int64))
    with pytest.raises(AbiArgumentError, match="splits"):
        tuned(layout, torch.tensor([2, 2], dtype=torch.int32))


def test_device_multiprocessors_on_the_cpu_is_the_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        count = torch.ops.helios.device_multiprocessors(torch.zeros(2, dtype=torch.int32))
    finally:
        torch.set_num_threads(before)
    assert count.dtype == torch.int32 and count.tolist() == [3]


def test_schemas_are_registered_and_export_records_both_ops():
    schemas = registered_schemas()
    assert schemas["helios::paged_attention_tuned"] == "helios::paged_attention_tuned" + PAGED_ATTENTION_TUNED_SCHEMA
    assert schemas["helios::device_multiprocessors"] == "helios::device_multiprocessors" + DEVICE_MULTIPROCESSORS_SCHEMA

    class Program(torch.nn.Module):
        def forward(self, buffer):
            return torch.ops.helios.device_multiprocessors(buffer) * 2

    exported = torch.export.export(Program(), (torch.zeros(1, dtype=torch.int32),), strict=False)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "helios.device_multiprocessors.default" in targets
