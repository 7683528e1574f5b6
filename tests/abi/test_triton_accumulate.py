"""`helios.abi.accumulate` (`helios.abi.triton_accumulate`): the integer accumulating ``index_put_`` kernel against ``index_put_``
itself, bit for bit (duplicates, negative and out-of-range indices, one value broadcast, strided
inputs), and the calls it hands back to ``index_put_``. Without CUDA the kernel runs under Triton's
interpreter (test_triton_attention enables it first); with CUDA it runs compiled, also inside a
CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention  # noqa: F401  (enables the interpreter on machines without CUDA first)
from helios.abi.accumulate import accumulate_into, covered
from helios.abi.triton_accumulate import launch
from test_triton_attention import DEVICE, ON_CUDA


def _run(target, indices, values):
    """(kernel result, index_put_ result) from copies of `target`."""
    ours = target.clone()
    call = accumulate_into if ON_CUDA else launch
    call(ours, [i.to(DEVICE) for i in indices], values.to(DEVICE))
    expected = target.cpu().clone().index_put_([i.cpu() for i in indices], values.cpu(), accumulate=True)
    return ours.cpu(), expected


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_counts_with_duplicate_rows_match_index_put(dtype):
    generator = torch.Generator().manual_seed(1)
    target = torch.randint(0, 50, (6, 300), generator=generator, dtype=dtype).to(DEVICE)
    rows = torch.tensor([0, 0, 3, 5, 0, 3] * 50)
    columns = torch.randint(0, 300, (300,), generator=generator)
    columns[:20] = 7  # the same entry many times
    values = torch.randint(-3, 4, (300,), generator=generator, dtype=dtype)
    ours, expected = _run(target, [rows, columns], values)
    assert torch.equal(ours, expected)


def test_one_index_with_negative_indices_and_one_value():
    target = torch.arange(10, dtype=torch.int64).to(DEVICE)
    indices = torch.tensor([0, -1, -1, 4, -10])
    ours, expected = _run(target, [indices], torch.tensor(5, dtype=torch.int64))
    assert torch.equal(ours, expected)
    ours, expected = _run(target, [indices.to(torch.int32)], torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64))
    assert torch.equal(ours, expected)


def test_strided_indices_and_values():
    target = torch.zeros(4, 9, dtype=torch.int32, device=DEVICE)
    pairs = torch.tensor([[0, 8], [3, 1], [0, 8], [2, 2]])
    values = torch.tensor([[1, 9], [2, 9], [3, 9], [4, 9]], dtype=torch.int32)[:, 0]  # stride 2
    ours, expected = _run(target, [pairs[:, 0], pairs[:, 1]], values)
    assert torch.equal(ours, expected)


def test_out_of_range_indices_add_nothing():
    target = torch.zeros(3, 4, dtype=torch.int32, device=DEVICE)
    rows, columns = torch.tensor([0, 3, 1, -4]), torch.tensor([1, 0, 4, 0])
    launch(target, [rows.to(DEVICE), columns.to(DEVICE)], torch.ones(4, dtype=torch.int32, device=DEVICE))
    expected = torch.zeros(3, 4, dtype=torch.int32)
    expected[0, 1] = 1
    assert torch.equal(target.cpu(), expected)


def test_empty_indices_change_nothing():
    target = torch.ones(5, dtype=torch.int64, device=DEVICE)
    launch(target, [torch.zeros(0, dtype=torch.int64, device=DEVICE)], torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(target.cpu(), torch.ones(5, dtype=torch.int64))


def test_uncovered_calls_run_index_put():
    floats = torch.zeros(4)
    assert not covered(floats, [torch.tensor([1, 1])], torch.ones(2))
    accumulate_into(floats, [torch.tensor([1, 1])], torch.ones(2))  # the CPU: index_put_ itself
    assert floats.tolist() == [0.0, 2.0, 0.0, 0.0]
    ints = torch.zeros(2, 3, dtype=torch.int32)
    assert not covered(ints, [torch.tensor([1])], torch.ones(1, dtype=torch.int32))  # a row slice, not an entry
    assert not covered(ints, [torch.tensor([1]), torch.tensor([0])], torch.ones(1, dtype=torch.int64))  # dtypes
    assert not covered(ints, [torch.tensor([1, 0]), torch.tensor([0])], torch.ones(2, dtype=torch.int32))
    assert not covered(ints, [torch.tensor([[1]]), torch.tensor([[0]])], torch.ones(1, dtype=torch.int32))
    assert covered(ints, [torch.tensor([1]), torch.tensor([0])], torch.ones(1, dtype=torch.int32))
    accumulate_into(ints, [torch.tensor([1])], torch.ones(1, 3, dtype=torch.int32))
    assert ints.tolist() == [[0, 0, 0], [1, 1, 1]]


@pytest.mark.gpu
def test_in_a_cuda_graph_the_counts_of_every_replay_add_up():
    if not ON_CUDA:
        pytest.skip("needs a CUDA device")
    counts = torch.zeros(4, 1000, dtype=torch.int32, device="cuda")
    pending = torch.zeros(4, dtype=torch.int64, device="cuda")
    slots = torch.tensor([2, 0, 0, 0], device="cuda")  # live row at slot 2, padding rows at slot 0
    tokens = torch.tensor([17, -1, -1, -1], device="cuda")
    counted = (tokens >= 0).to(torch.int32)
    change = torch.where(tokens >= 0, tokens - pending[slots], torch.zeros_like(tokens))

    def step():
        accumulate_into(counts, [slots, tokens.clamp(min=0)], counted)
        accumulate_into(pending, [slots], change)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert int(counts[2, 17]) == 4 and int(counts.sum()) == 4
    assert pending.tolist() == [0, 0, 68, 0]
