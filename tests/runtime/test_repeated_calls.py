"""Repeated pure calls in a CPU program's fast graph (`helios.runtime.loading.repeated_calls`):
merged only where nothing may write what they read or what they return, with the same values."""

from __future__ import annotations

import torch

from helios.runtime.loading.repeated_calls import merge_repeated_calls


def _traced(function) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(function)


def _calls(module: torch.fx.GraphModule, target) -> int:
    return sum(node.op == "call_function" and node.target is target for node in module.graph.nodes)


def _merged(function, *inputs) -> tuple[int, torch.fx.GraphModule]:
    """(calls removed, the merged module), after checking that both compute the same values and
    leave the inputs the same."""
    module = _traced(function)
    expected_inputs = [t.clone() for t in inputs]
    expected = module(*expected_inputs)
    count = merge_repeated_calls(module.graph)
    module.graph.lint()
    module.recompile()
    got_inputs = [t.clone() for t in inputs]
    got = module(*got_inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert all(torch.equal(a, b) for a, b in zip(got_inputs, expected_inputs))
    return count, module


def test_repeats_on_unwritten_inputs_are_made_once():
    def step(slots, bounds):
        first = torch.add(torch.clamp(slots, 0), 1)
        second = torch.mul(torch.clamp(slots, 0), 2)  # the same call again: merged
        tail = torch.add(torch.sub(bounds[1:], 1), torch.sub(bounds[1:], 1))  # a repeated view and its use
        return first, second, tail

    count, module = _merged(step, torch.tensor([3, -1, 2]), torch.tensor([0, 1, 4]))
    assert count == 3 and _calls(module, torch.clamp) == 1 and _calls(module, torch.sub) == 1


def test_a_repeat_over_a_tensor_something_writes_is_kept():
    def step(counts, slots, tokens):
        before = torch.clamp(counts, 0)
        torch.index_put_(counts, [slots], tokens, True)  # writes counts between the two reads
        after = torch.clamp(counts, 0)
        return torch.add(before, 0), torch.add(after, 0)

    count, module = _merged(step, torch.zeros(4, dtype=torch.int64), torch.tensor([1, 2]), torch.tensor([5, 7]))
    assert count == 0 and _calls(module, torch.clamp) == 2


def test_a_repeat_whose_result_is_written_or_returned_is_kept():
    def written(x, slots, values):
        target = torch.zeros_like(x)
        torch.index_put_(target, [slots], values)  # writes the first zeros_like's result
        other = torch.zeros_like(x)
        return target, torch.add(other, 1)

    count, module = _merged(written, torch.ones(4), torch.tensor([1]), torch.tensor([3.0]))
    assert count == 0 and _calls(module, torch.zeros_like) == 2

    def returned(x):
        return torch.ge(x, 0), torch.ge(x, 0)  # two outputs: the caller may write either

    count, _ = _merged(returned, torch.tensor([1.0, -1.0]))
    assert count == 0


def test_arguments_that_differ_only_in_representation_are_not_merged():
    def step(x):
        return tuple(torch.mul(torch.add(x, zero), 1) for zero in (0.0, -0.0, 0))  # three calls

    count, module = _merged(step, torch.tensor([-0.0, 1.0]))
    assert count == 0 and _calls(module, torch.add) == 3
