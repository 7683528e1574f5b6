"""The load-time program build (`helios.runtime.loading.program_build`) gives what torch's own path
gives: the same node metadata, code generated once for the module kept (and at once on other
threads), and a device move that leaves nothing on the CPU (proved on the meta device, where a
forgotten ``device=cpu`` argument fails the call)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from helios.abi.program_image import UnreadableProgramError, deserialize_program, read_program_image
from helios.abi.registry import registered_schemas
from helios.core.reader import open_core
from helios.runtime.loading.model import DeclaredOps, load_model, program_arguments, select_handles
from helios.runtime.loading.program_build import (
    code_on_first_use, deferred_recompile, finish_recompile, move_module, pending_recompile, static_tensor_metas,
)
from helios.runtime.loading.programs import load_program

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def core():
    return open_core(FIXTURES / "models" / "tiny_qwen3.core", accept="test.helios/fixtures",
                     trusted_keys=[FIXTURES / "cores" / "TEST-ONLY-signing.key.pub"])


def _image(core, name="program.mixed.r4t20.rank0"):
    return read_program_image(core.read_resource(name))


def _metas(exported):
    return [(n.name, type(n.meta["val"]).__name__, tuple(n.meta["val"].shape), n.meta["val"].stride(),
             n.meta["val"].dtype, n.meta["val"].device)
            for n in exported.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]


@pytest.mark.parametrize("name", ["program.decode.r1t1.rank0", "program.mixed.r4t20.rank0"])
def test_static_tensor_metas_equal_torchs(core, name, monkeypatch):
    plain = deserialize_program(_image(core, name))
    with static_tensor_metas():
        fast = deserialize_program(_image(core, name))
    assert _metas(fast) == _metas(plain) and len(_metas(plain)) > 50
    assert all(kind == "FakeTensor" for _, kind, *_ in _metas(fast))
    import helios.runtime.loading.program_build as build

    calls = []
    static = build._static
    monkeypatch.setattr(build, "_static", lambda values: calls.append(1) or static(values))
    with static_tensor_metas():
        deserialize_program(_image(core, name))
    assert len(calls) > 50  # the direct path was taken
    calls.clear()
    deserialize_program(_image(core, name))  # outside the block: torch's own path
    assert calls == []


def test_deferred_recompile_generates_code_once_for_the_module_kept(core):
    image = _image(core, "program.decode.r1t1.rank0")
    reference = deserialize_program(image).module()
    with deferred_recompile():
        module = deserialize_program(image).module()
        assert pending_recompile(module)
    assert pending_recompile(module)
    finish_recompile(module)
    assert not pending_recompile(module) and module.code == reference.code


def test_deferred_recompile_leaves_other_threads_alone():
    graph = torch.fx.symbolic_trace(lambda x: x + 1).graph
    built = {}
    started, release = threading.Event(), threading.Event()

    def other():
        started.wait()
        built["module"] = torch.fx.GraphModule(torch.nn.Module(), graph)
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    with deferred_recompile():
        started.set()
        release.wait(10)
        mine = torch.fx.GraphModule(torch.nn.Module(), graph)
    thread.join()
    assert not pending_recompile(built["module"]) and built["module"](torch.ones(1)).item() == 2.0
    assert pending_recompile(mine)
    assert finish_recompile(mine)(torch.ones(1)).item() == 2.0


def _lazy(graph):
    with deferred_recompile():
        module = torch.fx.GraphModule(torch.nn.Module(), graph)
    return code_on_first_use(module)


def test_code_on_first_use_generates_the_code_at_the_first_call_only():
    graph = torch.fx.symbolic_trace(lambda x: x * 3 + 1).graph
    reference = torch.fx.GraphModule(torch.nn.Module(), graph)
    called = _lazy(graph)
    assert pending_recompile(called)  # nothing generated yet
    assert called(torch.ones(2)).tolist() == [4.0, 4.0]
    assert not pending_recompile(called) and called.code == reference.code
    assert "eval_with_key" in type(called).forward.__code__.co_filename  # fx's generated forward from now on
    assert called(torch.full((1,), 2.0)).tolist() == [7.0]
    read = _lazy(graph)
    assert read.code == reference.code and not pending_recompile(read)  # reading the code generates it
    with deferred_recompile():  # a first call inside a deferring block still runs generated code
        assert _lazy(graph)(torch.zeros(1)).tolist() == [1.0]
    other = _lazy(graph)  # each module keeps its own class: generating one leaves the others pending
    assert pending_recompile(other)
    done = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert code_on_first_use(done) is done and type(done).__dict__.get("forward") is not None


def test_lazily_coded_programs_give_the_same_code_and_outputs(core):
    """`load_program(lazy_code=True)` (programs a CUDA load captures) leaves the module's code to its
    first use; the code and the outputs are those of the program built at once."""
    model = load_model(core)
    prepared = core.prepared
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    handles = select_handles(prepared, model.settings.max_concurrency)
    for program, handle in zip(model.programs, handles):
        arguments = program_arguments(program, model.weights, model.buffers)
        meta = [[w.to("meta") for w in arguments[0]], *[a.to("meta") for a in arguments[1:]]]
        eager = load_program(core, prepared, handle, declared, torch.device("meta"))
        lazy = load_program(core, prepared, handle, declared, torch.device("meta"), lazy_code=True)
        assert not pending_recompile(eager.module) and pending_recompile(lazy.module)
        outputs = lazy.module(*meta)
        assert not pending_recompile(lazy.module) and lazy.module.code == eager.module.code
        assert [(o.shape, o.dtype) for o in outputs] == [(o.shape, o.dtype) for o in eager.module(*meta)]
    cpu = load_program(core, prepared, handles[0], declared, torch.device("cpu"), lazy_code=True)
    assert not pending_recompile(cpu.module)  # the CPU path calls (and rewrites) its programs at once


def test_programs_moved_to_the_meta_device_run_there(core):
    """Every program of the fixture core, built for the meta device, runs on meta tensors: a
    parameter, constant or burnt-in ``device=`` left on the CPU would raise."""
    model = load_model(core)
    prepared = core.prepared
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    handles = select_handles(prepared, model.settings.max_concurrency)
    assert [h.graph for h in handles] == [p.graph for p in model.programs]
    for program, handle in zip(model.programs, handles):
        arguments = program_arguments(program, model.weights, model.buffers)
        meta = [[w.to("meta") for w in arguments[0]], *[a.to("meta") for a in arguments[1:]]]
        moved = load_program(core, prepared, handle, declared, torch.device("meta"))
        assert moved.input_shapes == program.input_shapes
        outputs = moved.module(*meta)
        cpu_outputs = program.module(*arguments)
        assert [(o.device.type, o.shape) for o in outputs] == [("meta", c.shape) for c in cpu_outputs]


def test_move_module_without_node_rewrites_would_fail(core):
    """The check above can fail: the same module moved with ``Module.to`` only calls a CPU op."""
    model = load_model(core)
    arguments = program_arguments(model.programs[0], model.weights, model.buffers)
    meta = [[w.to("meta") for w in arguments[0]], *[a.to("meta") for a in arguments[1:]]]
    module = deserialize_program(_image(core, "program.decode.r1t1.rank0")).module().to("meta")
    module.validate_inputs = False
    with pytest.raises(RuntimeError, match="device"):
        module(*meta)
    moved = move_module(deserialize_program(_image(core, "program.decode.r1t1.rank0")).module(),
                        torch.device("meta"))
    moved.validate_inputs = False
    assert all(o.device.type == "meta" for o in moved(*meta))


def test_a_union_with_an_unknown_tag_is_a_typed_error(core):
    image = _image(core, "program.decode.r1t1.rank0")
    node = next(n for n in image.graph["graph_module"]["graph"]["nodes"] if n["inputs"])
    node["inputs"][0]["arg"] = {"as_nothing_known": 1}
    with pytest.raises(UnreadableProgramError, match="as_nothing_known"):
        deserialize_program(image)
