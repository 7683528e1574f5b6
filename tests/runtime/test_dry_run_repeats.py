"""The precompile's dry run makes each repeated call of a plan once (`helios.runtime.loading.dry_run_repeats`):
which calls are skipped, what decides that two calls are alike, what a skipped call's result is, and
what always runs. On CUDA, that the dry run still finds every variant the capture needs is
tests/gpu/test_kernel_precompile_cuda.py."""

from __future__ import annotations

import types

import pytest
import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from helios.runtime.loading import dry_run_repeats
from helios.runtime.loading.dry_run_repeats import call_key, run_skipping_repeats, skippable

aten = torch.ops.aten


class _Calls(TorchDispatchMode):
    """The aten and helios ops called within, in order."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.made.append(func)
        return func(*args, **(kwargs or {}))


class _Layers(torch.nn.Module):
    """Four alike layers: a projection and a residual add on floats, a count on integers, an in-place
    add, then the helios RMSNorm."""

    def forward(self, x, w, norm, counts):
        for _ in range(4):
            h = aten.mm.default(x, w)
            x = aten.add.Tensor(h, x)
            counts = aten.add.Tensor(counts, 1)
            aten.add_.Tensor(x, 1.0)
            x = torch.ops.helios.rms_norm.default(x, norm, 1e-5)
        return x, counts


def _arguments():
    return [torch.randn(3, 8), torch.randn(8, 8), torch.ones(8), torch.zeros(3, dtype=torch.int64)]


def test_each_repeated_call_with_a_fresh_float_result_is_made_once():
    import helios.abi.fused  # noqa: F401 (registers helios::rms_norm)

    module = torch.fx.symbolic_trace(_Layers())
    with _Calls() as calls:
        skipped = run_skipping_repeats(module, _arguments(), {})
    made = [str(func) for func in calls.made]
    assert made.count("aten.mm.default") == 1
    assert made.count("helios.rms_norm.default") == 1
    assert made.count("aten.add_.Tensor") == 4  # returns what it writes: always made
    adds = [func for func in calls.made if str(func) == "aten.add.Tensor"]
    assert len(adds) == 1 + 4  # the float residual once, the integer count every time
    assert skipped == 3 * 3  # mm, the residual add and the norm of layers 2-4


def test_the_results_have_the_shapes_and_dtypes_the_graph_gives():
    import helios.abi.fused  # noqa: F401

    module = torch.fx.symbolic_trace(_Layers())
    arguments = _arguments()
    expected = module(*[a.clone() for a in arguments])
    interpreter = dry_run_repeats._SkippingRepeats(module, {})
    got = interpreter.run(*arguments)
    for mine, theirs in zip(got, expected):
        assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())
    assert torch.equal(got[1], expected[1])  # integer results are always computed


def test_graphs_of_one_plan_share_their_calls():
    import helios.abi.fused  # noqa: F401

    module, seen = torch.fx.symbolic_trace(_Layers()), {}
    assert run_skipping_repeats(module, _arguments(), seen) == 9
    with _Calls() as calls:
        assert run_skipping_repeats(module, _arguments(), seen) == 12  # the greedy graph: nothing new
    assert "aten.mm.default" not in [str(func) for func in calls.made]


def test_with_it_off_or_on_a_module_without_a_graph_every_call_is_made(monkeypatch):
    import helios.abi.fused  # noqa: F401

    monkeypatch.setattr(dry_run_repeats, "SKIP_REPEATS", False)
    with _Calls() as calls:
        assert run_skipping_repeats(torch.fx.symbolic_trace(_Layers()), _arguments(), {}) == 0
    assert [str(func) for func in calls.made].count("aten.mm.default") == 4
    monkeypatch.setattr(dry_run_repeats, "SKIP_REPEATS", True)
    called = []
    assert run_skipping_repeats(lambda *a: called.append(a), [1, 2], {}) == 0
    assert called == [(1, 2)]


def test_calls_are_alike_in_shape_strides_dtype_device_alignment_and_plain_values():
    base = torch.zeros(64, dtype=torch.bfloat16)
    key = call_key(aten.mm.default, (base[:32].view(4, 8), 3), {"alpha": 1.0})
    assert key == call_key(aten.mm.default, (torch.ones(4, 8, dtype=torch.bfloat16), 3), {"alpha": 1.0})
    differ = [
        ((torch.zeros(8, 4, dtype=torch.bfloat16), 3), {"alpha": 1.0}),  # shape
        ((torch.zeros(8, 4, dtype=torch.bfloat16).t(), 3), {"alpha": 1.0}),  # strides
        ((torch.zeros(4, 8), 3), {"alpha": 1.0}),  # dtype
        ((base[1:33].view(4, 8), 3), {"alpha": 1.0}),  # an address not 16-byte aligned
        ((torch.zeros(4, 8, dtype=torch.bfloat16), 16), {"alpha": 1.0}),  # a number
        ((torch.zeros(4, 8, dtype=torch.bfloat16), 3), {"alpha": 2.0}),
        ((torch.zeros(4, 8, dtype=torch.bfloat16), 3), {}),
        (([torch.zeros(4, 8, dtype=torch.bfloat16)], 3), {"alpha": 1.0}),  # a list of the tensor
    ]
    for args, kwargs in differ:
        assert call_key(aten.mm.default, args, kwargs) != key, (args, kwargs)
    assert call_key(aten.add.Tensor, (base[:32].view(4, 8), 3), {"alpha": 1.0}) != key  # the target
    assert call_key(aten.mm.default, (object(),), {}) is None  # not described: always made


def test_what_may_be_skipped():
    import helios.abi.collectives  # noqa: F401 (registers helios::all_reduce)
    import helios.abi.rotary_attention  # noqa: F401

    assert skippable(aten.mm.default) and skippable(aten.add.Tensor)
    assert skippable(torch.ops.helios.rotary_paged_attention.default)  # writes the cache, returns fresh
    assert not skippable(aten.add_.Tensor)  # returns what it writes
    assert not skippable(aten.view.default) and not skippable(aten.split_with_sizes.default)  # views
    assert not skippable(torch.ops.helios.all_reduce.default)  # a collective: every rank makes it
    for name in dry_run_repeats.SKIPPABLE_FUNCTIONS:
        module, qualname = name.rsplit(".", 1)
        assert skippable(types.SimpleNamespace(__module__=module, __qualname__=qualname))
    assert not skippable(types.SimpleNamespace(__module__="helios.abi.accumulate", __qualname__="accumulate_into"))
    assert not skippable(print)


def test_a_call_that_fails_raises_to_the_dry_run_which_leaves_it_to_the_warm_up():
    class Fails(torch.nn.Module):
        def forward(self, x):
            return aten.mm.default(x, x)

    with pytest.raises(RuntimeError):
        run_skipping_repeats(torch.fx.symbolic_trace(Fails()), [torch.zeros(2, 3)], {})
