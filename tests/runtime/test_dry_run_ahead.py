"""The precompile's dry run on stand-ins while the weights load (`helios.runtime.loading.dry_run_ahead`):
the stand-in weights, the memory rule, each plan handed to it as it is built, and when a load makes
it. The dry run itself on CUDA (every variant the capture needs found on the stand-ins, tokens
unchanged) is tests/gpu/test_kernel_precompile_cuda.py."""

from __future__ import annotations

import math
import types

import pytest
import torch

from helios.contract import manifest_pb2 as mpb
from helios.runtime.loading import dry_run_ahead, model
from helios.runtime.loading.dry_run_ahead import fits_twice, stand_in_weights, weight_bytes
from runtime.test_host_staging import engram  # noqa: F401 (the module-scoped Engram core fixture)
from runtime.test_model_fixture import open_fixture

GIB = 1 << 30


@pytest.fixture(scope="module")
def manifest():
    return open_fixture().prepared.manifest


def _weights(manifest):
    return [b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_WEIGHT]


def test_every_weight_gets_zeros_of_its_dtype_and_shape_one_tensor_per_shape(manifest):
    stand_ins = stand_in_weights(manifest, model._DTYPES, torch.device("cpu"))
    declared = _weights(manifest)
    assert set(stand_ins) == {b.name for b in declared}
    for buffer in declared:
        tensor = stand_ins[buffer.name]
        assert tuple(tensor.shape) == tuple(d.size for d in buffer.shape)
        assert tensor.dtype == model._DTYPES[buffer.dtype] and not tensor.any()
    shapes = {(tuple(t.shape), t.dtype) for t in stand_ins.values()}
    storages = {t.untyped_storage().data_ptr() for t in stand_ins.values()}
    assert len(storages) == len(shapes) < len(declared)  # the layers share their stand-ins
    held = sum(math.prod(shape) * dtype.itemsize for shape, dtype in shapes)
    assert weight_bytes(manifest, model._DTYPES, distinct=True) == held
    every = sum(math.prod(d.size for d in b.shape) * model._DTYPES[b.dtype].itemsize for b in declared)
    assert weight_bytes(manifest, model._DTYPES, distinct=False) == every > held


def test_the_stand_ins_are_made_only_if_they_fit_twice_beside_every_weight(manifest, monkeypatch):
    stand_ins = weight_bytes(manifest, model._DTYPES, distinct=True) + 1000
    needed = weight_bytes(manifest, model._DTYPES, distinct=False) + 2 * stand_ins + dry_run_ahead.MARGIN_BYTES
    for free, fits in ((needed - 1000, True), (needed - 1001, False), (80 * GIB, True)):
        # 1000 bytes of buffers allocated already (no longer free)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 141 * GIB))
        assert fits_twice(manifest, model._DTYPES, 1000, torch.device("cuda")) is fits


def test_plan_captures_hands_each_plan_to_the_dry_run_as_soon_as_it_is_built(monkeypatch):
    from helios.abi.registry import registered_schemas
    from helios.runtime.loading import cuda_graphs
    from helios.runtime.loading.programs import DeclaredOps, load_program

    core = open_fixture()
    prepared, device = core.prepared, torch.device("meta")
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    programs = [load_program(core, prepared, h, declared, device) for h in model.select_handles(prepared, 8)]
    seen, planned = [], []
    build = cuda_graphs._plan

    def plan(program, device):
        assert len(seen) == len(planned)  # the plan before this one was dry-run before this one is built
        planned.append(program)
        return build(program, device)
    monkeypatch.setattr(cuda_graphs, "_plan", plan)
    plans = cuda_graphs.plan_captures(programs, device, ahead=seen.append)
    assert [p.program for p in seen] == programs == planned
    assert all(plans.plans[id(p.program)] is p for p in seen)


def _compiler(active: bool):
    return types.SimpleNamespace(active=active)


def test_a_load_makes_it_with_workers_on_one_rank_only(monkeypatch):
    prepared = types.SimpleNamespace(manifest=types.SimpleNamespace(ranks=1))
    allocated = []
    monkeypatch.setattr(model, "_allocate", lambda *args: allocated.append(args) or {})
    assert model._dry_run_ahead(prepared, (), _compiler(False), torch.device("cuda"), 9, 4, 0) is None
    prepared.manifest.ranks = 2
    assert model._dry_run_ahead(prepared, (), _compiler(True), torch.device("cuda"), 9, 4, 0) is None
    assert allocated == []  # nothing allocated either way


def test_a_load_whose_stand_ins_fail_leaves_the_dry_run_to_the_capture(monkeypatch, caplog):
    prepared = types.SimpleNamespace(manifest=types.SimpleNamespace(ranks=1))

    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(model, "_allocate", out_of_memory)
    with caplog.at_level("INFO", logger=model.__name__):
        assert model._dry_run_ahead(prepared, (), _compiler(True), torch.device("cuda"), 9, 4, 0) is None
    assert "waits for the capture" in caplog.text and "OutOfMemoryError" in caplog.text
    monkeypatch.setattr(model, "_allocate", lambda *args: {})
    monkeypatch.setattr(model, "buffer_bytes", lambda buffers: 0)
    monkeypatch.setattr(model, "fits_twice", lambda *args: False)
    caplog.clear()
    with caplog.at_level("INFO", logger=model.__name__):
        assert model._dry_run_ahead(prepared, (), _compiler(True), torch.device("cuda"), 9, 4, 0) is None
    assert "do not fit twice" in caplog.text


def test_a_plans_dry_run_calls_each_graph_on_the_arguments_and_leaves_failures_to_the_warm_up(caplog):
    from helios.runtime.loading.cuda_graphs import _Plan, dry_run_plan

    called = []

    def graph(name, fails=False):
        def module(*arguments):
            called.append((name, arguments))
            if fails:
                raise RuntimeError(f"{name} failed")
        return module

    fresh = (graph("fresh full", fails=True), graph("fresh greedy"))
    plan = _Plan(None, "prefill (batch 1)", (graph("full"), None), fresh)
    protected = []
    compiler = types.SimpleNamespace(label="", protect=protected.append)
    with caplog.at_level("DEBUG", logger="helios.runtime.loading.cuda_graphs"):
        dry_run_plan(plan, [1, 2], compiler)
    assert called == [("full", (1, 2)), ("fresh full", (1, 2)), ("fresh greedy", (1, 2))]
    assert compiler.label == "prefill (batch 1)" and "fresh full failed" in caplog.text
    assert protected == [[], [], []]  # plain callables hold no tensors of their own


def _loaded_programs(core):
    from helios.abi.registry import registered_schemas
    from helios.runtime.loading.programs import DeclaredOps, load_program

    prepared = core.prepared
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    return [load_program(core, prepared, h, declared, torch.device("cpu")) for h in model.select_handles(prepared, 8)]


def test_static_page_extents_size_the_stand_ins_and_bound_the_pages_a_load_takes(engram):
    """A core whose programs take a static number of cache pages (the Engram test core: 32, where its
    context needs 8 + 1): the dry run's stand-ins get that many (they were sized for one context and
    the narrowing of the planes failed the CUDA load), and a load asked for fewer stops with a typed
    error instead of torch's narrowing error."""
    from helios.contract import StartupOptions
    from helios.runtime.loading.model import LoadOptions, TooFewPagesError
    from helios.runtime.service import RuntimeOptions, build_runtime

    assert model.static_pages(open_fixture().prepared, _loaded_programs(open_fixture())) == 0  # symbolic pages
    core = open_fixture(engram[1])
    assert model.static_pages(core.prepared, _loaded_programs(core)) == 32
    with pytest.raises(TooFewPagesError, match="9 physical cache pages asked for.*take 32"):
        build_runtime(open_fixture(engram[1]), RuntimeOptions(load=LoadOptions(startup=StartupOptions(), num_pages=9)))
    runtime = build_runtime(open_fixture(engram[1]), RuntimeOptions(load=LoadOptions(startup=StartupOptions(),
                                                                                     num_pages=32)))
    runtime.close()


def test_a_plan_whose_stand_in_arguments_fail_is_left_to_the_capture(caplog):
    from helios.runtime.loading.dry_run_ahead import DryRunAhead

    ahead = DryRunAhead.__new__(DryRunAhead)  # no CUDA stream: the call returns before using it

    def arguments_of(program):
        raise RuntimeError("start (0) + length (32) exceeds dimension size (9).")
    ahead.compiler, ahead.arguments_of, ahead.plans, ahead.seconds = None, arguments_of, 0, 0.0
    plan = types.SimpleNamespace(program=object(), name="decode (batch 4, 4 tokens)")
    with caplog.at_level("INFO", logger=dry_run_ahead.__name__):
        ahead(plan)
    assert ahead.plans == 0 and "leaves decode (batch 4, 4 tokens) to the capture" in caplog.text
    assert "exceeds dimension size" in caplog.text
