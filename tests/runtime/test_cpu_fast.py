"""CPU programs checked once (`helios.runtime.loading.cpu_programs`, `cpu_fast`, `fast_calls`): the
first call runs the checked bodies, later calls with the same tensors the fast graph, and every
call's outputs and in-place writes equal the exported module's bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import helios.abi.attention  # noqa: F401 (registers the ops)
import helios.abi.completion  # noqa: F401
import helios.abi.fused  # noqa: F401
import helios.abi.sampling  # noqa: F401
from helios.abi import cpu_bodies
from helios.abi.grammar import mask_words
from helios.abi.paged_reference import plan_attention
from helios.abi.registry import AbiArgumentError
from helios.runtime.loading.cpu_fast import fast_graph
from helios.runtime.loading.cpu_programs import CpuProgram, cpu_program
from helios.runtime.loading.fast_calls import FAST_CALLS

HEADS, KV_HEADS, DIM, HIDDEN, VOCAB, PAGE_TOKENS = 4, 2, 8, 32, 40, 4
ROWS, LAYERS = 3, 2


class _Decoder(torch.nn.Module):
    """A runtime-shaped two-layer decode program: fused qkv, rotary + cache write, paged attention,
    fused norms and MLP, sampling whose tokens the sampled rows select, a completion record."""

    def forward(self, weights, k_cache, v_cache, token_ids, positions, page_table, query_lens, sample_rows,
                temperature, penalties, output_counts, grammar_mask):
        starts = torch.cat([torch.zeros(1, dtype=torch.int32), query_lens.cumsum(0).to(torch.int32)])
        slots = (page_table[torch.arange(ROWS), positions // PAGE_TOKENS].to(torch.int64) * PAGE_TOKENS
                 + positions % PAGE_TOKENS)
        slots = torch.where(query_lens > 0, slots, torch.full_like(slots, -1))
        angles = positions.unsqueeze(1).to(torch.float32) * weights[0].unsqueeze(0)
        cos, sin = torch.cat([angles, angles], -1).cos().unsqueeze(1), torch.cat([angles, angles], -1).sin().unsqueeze(1)
        x = torch.nn.functional.embedding(token_ids, weights[1])
        normed = torch.ops.helios.rms_norm(x, weights[2], 1e-6)
        for layer in range(LAYERS):
            q, k, v = torch.nn.functional.linear(normed, weights[3 + layer]).split(
                [HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
            q = torch.ops.helios.rotary_cache_write(q.reshape(ROWS, HEADS, DIM), k.reshape(ROWS, KV_HEADS, DIM),
                                                   v.reshape(ROWS, KV_HEADS, DIM), cos, sin, k_cache[layer],
                                                   v_cache[layer], slots)
            attended = torch.ops.helios.paged_attention(q, k_cache[layer], v_cache[layer], page_table, starts,
                                                        positions, 0.35, 0)
            x, normed = torch.ops.helios.add_rms_norm(x, attended.reshape(ROWS, HIDDEN), weights[2], 1e-6)
            mlp = torch.ops.helios.silu_mul(torch.nn.functional.linear(normed, weights[5]))
            x, normed = torch.ops.helios.add_rms_norm(x, torch.nn.functional.linear(mlp, weights[6]), weights[2], 1e-6)
        logits = torch.nn.functional.linear(normed, weights[1])
        zeros = torch.zeros_like(temperature)
        tokens = torch.ops.helios.sample(logits, token_ids, positions, temperature, zeros.to(torch.int32),
                                         torch.ones_like(temperature), zeros, penalties, output_counts,
                                         output_counts, grammar_mask, torch.ones_like(sample_rows))
        tokens = torch.where(sample_rows, tokens, torch.full_like(tokens, -1))
        output_counts.index_put_([torch.arange(ROWS), tokens.clamp(0)], (tokens >= 0).to(torch.int32), True)
        lens = query_lens.to(torch.int64)
        record = torch.ops.helios.completion_record(token_ids, token_ids, lens[:1], tokens, lens, zeros.to(torch.int64),
                                                    (tokens >= 0).to(torch.int64), positions + 1, None)
        return record, logits


def _weights():
    generator = torch.Generator().manual_seed(0)
    width = (HEADS + 2 * KV_HEADS) * DIM
    return [1.0 / 100 ** (torch.arange(DIM // 2) / (DIM // 2)), torch.randn(VOCAB, HIDDEN, generator=generator),
            torch.rand(HIDDEN, generator=generator) + 0.5, torch.randn(width, HIDDEN, generator=generator) * 0.3,
            torch.randn(width, HIDDEN, generator=generator) * 0.3, torch.randn(2 * 24, HIDDEN, generator=generator) * 0.3,
            torch.randn(HIDDEN, 24, generator=generator) * 0.3]


def _inputs(step: int):
    positions = torch.tensor([5 + step, 2 + step, 9 + step])
    return [torch.zeros(LAYERS, 12, PAGE_TOKENS, KV_HEADS, DIM), torch.zeros(LAYERS, 12, PAGE_TOKENS, KV_HEADS, DIM),
            torch.tensor([3, 7, 11]), positions, torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32),
            torch.tensor([1, 1, 1], dtype=torch.int32), torch.tensor([True, True, False]), torch.zeros(ROWS),
            torch.tensor([[1.0, 0.0, 0.0]] * 2 + [[0.0, 0.0, 0.0]]), torch.zeros(ROWS, VOCAB, dtype=torch.int32),
            torch.full((ROWS, mask_words(VOCAB)), -1, dtype=torch.int32)]


def _program():
    exported = torch.export.export(_Decoder(), (_weights(), *_inputs(0)), strict=False)
    return exported.module()


def _steps(call, weights, inputs, contents) -> list:
    """Runs `call` on the same tensors for each step's contents (copied in); outputs and state."""
    results = []
    for step in contents:
        for tensor, value in zip(inputs[2:], step[2:]):
            tensor.copy_(value)
        outputs = call(weights, *inputs)
        results.append([output.clone() for output in outputs] + [inputs[0].clone(), inputs[1].clone(), inputs[-2].clone()])
    return results


def test_later_calls_run_the_fast_graph_with_the_exported_modules_values_bit_for_bit():
    steps = [_inputs(step) for step in range(4)]
    module = _program()
    expected = _steps(module, _weights(), _inputs(0), steps)
    program = cpu_program(_program())
    assert isinstance(program, CpuProgram) and program.fast is not None
    used = []
    fast_forward = program.fast.forward
    program.fast.forward = lambda *args: used.append(1) or fast_forward(*args)
    got = _steps(program, _weights(), _inputs(0), steps)
    assert len(used) == 3  # the first call checked, the others fast
    for got_step, expected_step in zip(got, expected):
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got_step, expected_step))


def test_the_fast_graph_plans_once_per_step_and_calls_unchecked_bodies():
    program = cpu_program(_program())
    targets = [node.target for node in program.fast.graph.nodes if node.op == "call_function"]
    assert targets.count(plan_attention) == 1 and targets.count(cpu_bodies.plan_rotary) == 1
    assert targets.count(cpu_bodies.plan_slots) == 1
    assert targets.count(cpu_bodies.attention_planned) == LAYERS == targets.count(cpu_bodies.rotary_cache_write_planned)
    assert cpu_bodies.sample_rows in targets and cpu_bodies.add_rms_norm in targets
    assert not [t for t in targets if isinstance(t, torch._ops.OpOverload) and t in FAST_CALLS]
    assert not [t for t in targets if isinstance(t, torch._ops.OpOverload) and t.namespace == "helios"]


def test_other_tensors_are_checked_again():
    program = cpu_program(_program())
    weights, inputs = _weights(), _inputs(0)
    program(weights, *inputs)
    program(weights, *inputs)  # fast
    bad = list(inputs)
    bad[0] = torch.zeros(LAYERS, 12, PAGE_TOKENS, KV_HEADS, DIM, dtype=torch.float64)
    with pytest.raises(AbiArgumentError):
        program(weights, *bad)


def test_a_graph_with_data_dependent_shapes_has_no_fast_graph():
    class Selects(torch.nn.Module):
        def forward(self, weights, x):
            return (x[x > 0] * weights[0].sum(),)

    module = torch.export.export(Selects(), ([torch.ones(2)], torch.randn(5)), strict=False).module()
    assert fast_graph(module.graph) is None
    program = cpu_program(module)
    assert not isinstance(program, CpuProgram) or program.fast is None


class _Dispatched(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_each_fast_call_dispatches_to_the_overload_it_replaces_with_the_same_values():
    """Every aten call of the program, made through its overload and through its `FAST_CALLS`
    binding on the same argument values, reaches the same kernels and gives the same result."""
    module = _program()
    values = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, node):
            values[node] = result = super().run_node(node)
            return result

    Record(module).run(*_weights(), *_inputs(0))
    checked = set()
    for node in module.graph.nodes:
        fast = FAST_CALLS.get(node.target) if node.op == "call_function" else None
        if fast is None:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _copy(values[n]))
        with _Dispatched() as overload:
            expected = node.target(*args, **kwargs)
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _copy(values[n]))
        with _Dispatched() as binding:
            got = fast(*args, **kwargs)
        assert overload.ops == binding.ops, node.target
        assert _equal(got, expected), node.target
        checked.add(node.target)
    assert len(checked) >= 20


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _example_calls() -> dict:
    """Arguments an exported graph passes to each `FAST_CALLS` overload (tensors, scalars, lists,
    keywords): one or two calls each."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, generator=generator), torch.randn(3, 4, generator=generator)
    ints = torch.tensor([[3, -2, 7, 0], [1, 5, -4, 2], [0, 0, 9, -1]])
    bools = torch.rand(3, 4, generator=generator) > 0.5
    cpu = torch.device("cpu")
    a = torch.ops.aten
    return {
        a.add.Tensor: [(x, y), (x, 2)], a.sub.Tensor: [(x, y), (ints, 1)], a.mul.Tensor: [(x, y), (ints, 16)],
        a.div.Tensor: [(x, y), (x, 3)], a.div.Tensor_mode: [((ints, 4), {"rounding_mode": "floor"})],
        a.remainder.Scalar: [(ints, 4)], a.remainder.Tensor: [(ints, ints.abs() + 1)], a.neg.default: [(x,)],
        a.cos.default: [(x,)], a.sin.default: [(x,)], a.rsqrt.default: [(x.abs() + 1,)],
        a.pow.Tensor_Scalar: [(x, 2)], a.mean.dim: [(x, [-1], True)], a.__and__.Tensor: [(bools, ~bools)],
        a.bitwise_and.Tensor: [(ints, ints + 1)], a.eq.Scalar: [(ints, 0)], a.eq.Tensor: [(ints, ints.flip(0))],
        a.ne.Scalar: [(x, 0.5)], a.ge.Scalar: [(ints, 0)], a.ge.Tensor: [(x, y)], a.gt.Scalar: [(ints, 0)],
        a.gt.Tensor: [(x, y)], a.le.Scalar: [(x, 0.0)], a.lt.Scalar: [(ints, 2)], a.lt.Tensor: [(x, y)],
        a.where.self: [(bools, x, y)], a.clamp.default: [(ints, 0), (ints, None, 5), (x, -0.5, 0.5)],
        a.cat.default: [([x, y],), ([x, y], -1)], a.cumsum.default: [(ints, 0)],
        a.embedding.default: [(x, torch.tensor([2, 0, 1]))],
        a.full_like.default: [((ints, -1), {"pin_memory": False})],
        a.zeros_like.default: [((x,), {"pin_memory": False})], a.ones_like.default: [((bools,), {"pin_memory": False})],
        a.zeros.default: [(([2],), {"dtype": torch.int32, "device": cpu, "pin_memory": False})],
        a.arange.default: [((5,), {"dtype": torch.int32, "device": cpu, "pin_memory": False})],
        a.arange.start: [((2, 7), {"dtype": torch.int64, "device": cpu, "pin_memory": False})],
        a.index_put_.default: [(ints.clone(), [torch.tensor([0, 2]), torch.tensor([1, 1])], torch.tensor([5, 6]), True)],
        a.index_select.default: [(x, 0, torch.tensor([2, 0]))],
        a.index.Tensor: [(x, [torch.tensor([2, 0, 2])]), (x, [torch.tensor([1, 2]), torch.tensor([3, -1])]),
                         (x, [bools[:, 0]]), (x, [torch.tensor([0, 1], dtype=torch.int32)]),
                         (x, [None, torch.tensor([1, 3])]), (x, [torch.tensor(1)])],  # the last two: boxed
        a.linear.default: [(x, y), (x, y, torch.ones(3))],
        a.reshape.default: [(x, [4, 3])], a.view.default: [(x, [2, 6])],
        a.scatter_add.default: [(x, 1, torch.tensor([[0], [3], [1]]), torch.ones(3, 1))],
        a.searchsorted.Tensor: [((torch.tensor([1, 3, 5]), torch.tensor([0, 3, 6])), {"right": True})],
        a.select.int: [(x, 0, 1)], a.split_with_sizes.default: [(x, [1, 3], -1)],
        a.to.dtype: [(ints, torch.int32), (x, torch.float16)], a.unsqueeze.default: [(x, 1)],
        a.squeeze.dim: [(x.unsqueeze(1), 1)], a.transpose.int: [(x, 0, 1)], a.permute.default: [(x, [1, 0])],
        a.expand.default: [(x[:, :1], [3, 4])], a.roll.default: [(x, [2], [-1])], a.sym_size.int: [(x, 1)],
    }


def test_every_fast_call_reaches_the_overload_it_replaces():
    calls = _example_calls()
    assert set(calls) == set(FAST_CALLS)
    for overload, examples in calls.items():
        for example in examples:
            with_keywords = len(example) == 2 and isinstance(example[0], tuple) and isinstance(example[1], dict)
            args, kwargs = example if with_keywords else (example, {})
            with _Dispatched() as through_overload:
                expected = overload(*[_copy(arg) for arg in args], **kwargs)
            with _Dispatched() as through_binding:
                got = FAST_CALLS[overload](*[_copy(arg) for arg in args], **kwargs)
            assert through_overload.ops == through_binding.ops, overload
            assert _equal(got, expected), overload


class _GatheredCounts(torch.nn.Module):
    """Sampling as the runtime's programs build it: both count tables gathered by request slot."""

    def forward(self, weights, hidden, slots, sample_rows, temperature, penalties, prompt_counts, output_counts,
                grammar_mask):
        logits = torch.nn.functional.linear(hidden, weights[0])
        zeros = torch.zeros_like(temperature)
        rows = slots.clamp(min=0)
        tokens = torch.ops.helios.sample(logits, slots, slots, temperature, zeros.to(torch.int32),
                                         torch.ones_like(temperature), zeros, penalties, prompt_counts[rows],
                                         output_counts[rows], grammar_mask, torch.ones_like(sample_rows))
        tokens = torch.where(sample_rows, tokens, torch.full_like(tokens, -1))
        output_counts.index_put_([rows, tokens.clamp(0)], (tokens >= 0).to(torch.int32), True)
        return (tokens,)


def _gathered_inputs(step: int):
    generator = torch.Generator().manual_seed(step)
    hidden = torch.randn(ROWS, VOCAB, generator=generator)
    hidden[:, 7] = 9.0  # greedy picks 7 until a penalty on it turns the choice (the weights are the identity)
    greedy = [[1.0, 0.0, 0.0]] * 2 + [[0.0, 0.0, 0.0]]
    penalties = torch.tensor(greedy if step != 1 else [[1.0, 0.0, 20.0]] + greedy[1:])
    temperature = torch.tensor([0.0, 0.7 if step == 2 else 0.0, 0.0])
    prompt_counts = torch.zeros(4, VOCAB, dtype=torch.int32)
    prompt_counts[2, 3] = 2
    return [hidden, torch.tensor([2, 0, -1]), torch.tensor([True, True, False]), temperature, penalties,
            prompt_counts, torch.zeros(4, VOCAB, dtype=torch.int32),
            torch.full((ROWS, mask_words(VOCAB)), -1, dtype=torch.int32)]


def test_count_rows_are_gathered_only_when_a_row_is_penalised_or_draws():
    weights = [torch.eye(VOCAB)]
    example = (weights, *_gathered_inputs(0))
    exported = torch.export.export(_GatheredCounts(), example, strict=False).module()
    program = cpu_program(torch.export.export(_GatheredCounts(), example, strict=False).module())
    nodes = [node for node in program.fast.graph.nodes if node.op == "call_function"]
    assert [node.target for node in nodes].count(cpu_bodies.sample_rows_gathering) == 1
    assert not [node for node in nodes if node.target is torch.ops.aten.index.Tensor]
    expected_inputs, inputs, expected, got = _gathered_inputs(0), _gathered_inputs(0), [], []
    for step in [_gathered_inputs(step) for step in (0, 1, 2, 0, 1)]:  # the same tensors each call
        for call, tensors, results in ((exported, expected_inputs, expected), (program, inputs, got)):
            for tensor, value in zip(tensors[:5] + tensors[7:], step[:5] + step[7:]):
                tensor.copy_(value)
            results.append(call(weights, *tensors)[0].clone())
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert torch.equal(inputs[6], expected_inputs[6])  # the output counts
    assert got[0][0] == 7 and got[1][0] != 7  # the penalised step read the gathered counts
