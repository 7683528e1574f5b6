"""A captured program without a greedy graph (a token-logprobs variant) replays its full graph for
greedy steps; every other program keeps both; a program with a fresh-chunk variant replays that
variant's graphs for fresh steps. Stand-in graphs record what is replayed (the CUDA capture itself
is covered by tests/gpu)."""

from __future__ import annotations

import dataclasses

import pytest

from helios.runtime.loading.cuda_graphs import CaptureError, CapturedProgram, wants_greedy_graph
from helios.runtime.loading.programs import LoadedProgram


class _Graph:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)

    def reset(self):
        self.log.append(f"reset {self.name}")


def test_a_program_without_a_greedy_graph_replays_the_full_one_for_greedy_steps():
    log = []
    both = CapturedProgram((_Graph("full", log), "full outputs"), (_Graph("greedy", log), "greedy outputs"), [])
    only_full = CapturedProgram((_Graph("full", log), "full outputs"), None, [])
    assert both.has_greedy_graph and not only_full.has_greedy_graph
    assert both.replay(greedy=True) == "greedy outputs" and both.replay(greedy=False) == "full outputs"
    assert only_full.replay(greedy=True) == "full outputs" and only_full.replay(greedy=False) == "full outputs"
    assert log == ["greedy", "full", "full", "full"]
    only_full.release()
    assert log[-1] == "reset full"
    with pytest.raises(CaptureError, match="released"):
        only_full.replay(greedy=True)


def test_only_token_logprobs_variants_go_without_a_greedy_graph():
    plain = LoadedProgram("decode", 1, 4, 4, None, (), (), (), ())
    assert wants_greedy_graph(plain)
    assert not wants_greedy_graph(dataclasses.replace(plain, graph="decode_logprobs", token_logprobs=20))


def test_fresh_steps_replay_the_fresh_variant_where_the_program_has_one():
    log = []
    fresh = CapturedProgram((_Graph("fresh full", log), "fresh full outputs"),
                            (_Graph("fresh greedy", log), "fresh greedy outputs"), [])
    program = CapturedProgram((_Graph("full", log), "full outputs"), (_Graph("greedy", log), "greedy outputs"), [],
                              fresh=fresh)
    plain = CapturedProgram((_Graph("full", log), "full outputs"), None, [])
    assert program.has_fresh_graph and not plain.has_fresh_graph
    assert program.replay(greedy=True, fresh=True) == "fresh greedy outputs"
    assert program.replay(greedy=False, fresh=True) == "fresh full outputs"
    assert program.replay(greedy=True) == "greedy outputs"
    assert plain.replay(greedy=False, fresh=True) == "full outputs"  # no variant: the program's own graph
    assert log == ["fresh greedy", "fresh full", "greedy", "full"]
    program.release()
    assert sorted(log[4:]) == ["reset fresh full", "reset fresh greedy", "reset full", "reset greedy"]
    with pytest.raises(CaptureError, match="released"):
        program.replay(greedy=True, fresh=True)


def test_the_capture_plan_generates_each_graph_module_once_with_the_code_of_every_rewrite():
    """`cuda_graphs.plan_captures` (and `_plan` for a program planned at capture) defers the code generation of the rewrites' intermediate modules and
    rewrites its own copies in place: the modules it returns have the code the rewrites give one by
    one, copying (built on the meta device, as the CUDA path builds them), none is left pending, and
    the loaded program's module is unchanged."""
    import torch

    from helios.abi.registry import registered_schemas
    from helios.runtime.loading import cuda_graphs
    from helios.runtime.loading.model import select_handles
    from helios.runtime.loading.program_build import pending_recompile
    from helios.runtime.loading.programs import DeclaredOps, load_program
    from runtime.test_model_fixture import open_fixture

    core = open_fixture()
    prepared, device = core.prepared, torch.device("meta")
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    programs = [load_program(core, prepared, handle, declared, device) for handle in select_handles(prepared, 8)]
    assert programs
    loaded = {id(p): (p.module.code, str(p.module.graph)) for p in programs}
    ahead = cuda_graphs.plan_captures(programs[1:], device)  # as load_model builds them, the weights not read
    for program in programs:
        module = cuda_graphs.gemv_module(cuda_graphs.rotary_module(program.module))
        expected = cuda_graphs._graph_variants(module, program, device, owned=False)
        arguments = [torch.empty(1, device=device)]
        plan = ahead.take(program, device, arguments)  # the first program is planned on demand
        assert plan.program is program and plan.arguments is arguments
        assert id(program) not in ahead.plans  # taken once
        loaded_now = (program.module.code, str(program.module.graph))
        assert loaded_now == loaded[id(program)]
        assert [m is None for m in plan.main] == [m is None for m in expected]
        for built, reference in zip(plan.main, expected):
            if built is not None:
                assert not pending_recompile(built) and built.code == reference.code
