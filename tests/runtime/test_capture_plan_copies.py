"""`cuda_graphs.plan_captures` copies the program's graph once per captured module: every rewrite after
the first that changes a graph is given that copy and rewrites it in place. On tiny bfloat16 cores'
programs (Llama 3; Mistral, every attention windowed), built on the meta device as the CUDA path builds
them, with every rewrite applying (Triton tiles for their projections, fresh-chunk variants,
token-logprobs programs without a greedy graph, with and without the elementwise runs), each planned
module's graph and code equal those the rewrites give applied one by one, each on a copy of its input;
the programs' own graphs are unchanged; and no two planned modules, nor a planned module and its
program, share a graph."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from helios.abi import gemv_tiles
from helios.abi.registry import registered_schemas
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading import cuda_graphs, elementwise_runs, fresh_calls
from helios.runtime.loading.model import select_handles
from helios.runtime.loading.programs import DeclaredOps, load_program
from ignition.hf_checkpoints import LLAMA3, MISTRAL
from runtime.test_greedy_rows_graph import NAMESPACE as GREEDY_ROWS_NAMESPACE, greedy_rows_core
from support.chat_checkpoint import write_chat_checkpoint

DEVICE = torch.device("meta")
NAMESPACE = "test.helios/capture-plan-copies"


def _copied(program) -> list:
    """The captured modules the rewrites give one by one, each copying its input's graph."""
    module = cuda_graphs.gemv_module(cuda_graphs.rotary_module(program.module))
    fresh = cuda_graphs.fresh_module(module) if cuda_graphs.wants_fresh_graph(program) else None
    built = []
    for base in (module, fresh):
        if base is None:
            continue
        built.append(elementwise_runs.runs_module(cuda_graphs.step_module(base, DEVICE)))
        if cuda_graphs.wants_greedy_graph(program):
            bound = cuda_graphs.greedy_module(base)
            built.append(elementwise_runs.runs_module(cuda_graphs.step_module(bound, DEVICE)))
    return built


def _text(module) -> str:
    """The graph and its code, the generated kernels' numbers left out (each build numbers its own)."""
    return re.sub(r"elementwise_run_\d+", "elementwise_run", f"{module.graph}\n{module.code}")


class _Copies:
    def __init__(self, monkeypatch):
        self.count = 0
        real = torch.fx.Graph.__deepcopy__

        def counted(graph, memo=None):
            self.count += 1
            return real(graph, memo)

        monkeypatch.setattr(torch.fx.Graph, "__deepcopy__", counted)


@pytest.fixture(scope="module", params=[LLAMA3, MISTRAL], ids=["llama3", "mistral_windowed"])
def core(request, tmp_path_factory):
    """A tiny bfloat16 core with token-logprobs variants: Llama 3 (rotary pairs, fused and made fresh;
    test_greedy_rows_graph's bfloat16 core, prepared once per run) and Mistral (every attention
    windowed: no fresh pair)."""
    if request.param is LLAMA3:
        path, key = greedy_rows_core(tmp_path_factory.getbasetemp(), "bfloat16")
        return open_core(path, accept=GREEDY_ROWS_NAMESPACE, trusted_keys=[key.public]), False
    root = tmp_path_factory.mktemp(request.param.name)
    key = SigningKey.generate()
    checkpoint = write_chat_checkpoint(request.param, root / "checkpoint", seed=3)
    plan = CapacityPlan(context_tokens=128, prefill_tokens=32, decode_batches=(1, 4), mixed=True, token_logprobs=True)
    prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan))
    return open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[key.public]), True


@pytest.fixture
def programs(core, monkeypatch):
    """The core's programs, built as the CUDA path builds them, with tiles for their projections (one
    row: the GEMV; more: the skinny product) and fresh variants for their prompt programs."""
    core, _ = core
    prepared = core.prepared
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    loaded = [load_program(core, prepared, handle, declared, DEVICE, lazy_code=True)
              for handle in select_handles(prepared, 8)]
    for program in loaded:
        for node in program.module.graph.nodes:
            if node.target is torch.ops.aten.linear.default:
                rows = math.prod(node.args[0].meta["val"].shape[:-1])
                out_features, in_features = node.args[1].meta["val"].shape
                if rows == 1:
                    monkeypatch.setitem(gemv_tiles.GEMV_TILES, (out_features, in_features), gemv_tiles.GemvTile())
                else:
                    bucket = 1 << (rows - 1).bit_length()
                    monkeypatch.setitem(gemv_tiles.SKINNY_TILES, (bucket, out_features, in_features),
                                        gemv_tiles.SkinnyTile(16, 64, 64, 1, 4, 2))
    monkeypatch.setattr(fresh_calls, "FRESH_MIN_TOKENS", 16)
    return loaded


@pytest.mark.parametrize("runs", [False, True], ids=["steps", "steps_and_runs"])
def test_each_planned_graph_is_one_copy_rewritten_in_place_and_equals_the_rewrites_on_copies(
        core, programs, monkeypatch, runs):
    monkeypatch.setattr(elementwise_runs, "FUSE_RUNS", runs)
    before = {id(p): _text(p.module) for p in programs}
    expected = {id(p): [_text(m) for m in _copied(p)] for p in programs}
    assert all(p.module.graph is not None and _text(p.module) == before[id(p)] for p in programs)
    assert any(cuda_graphs.wants_fresh_graph(p) for p in programs)
    copies = _Copies(monkeypatch)
    plans = cuda_graphs.plan_captures(programs, DEVICE)
    planned = 0
    for program in programs:
        plan = plans.plans[id(program)]
        modules = plan.modules()
        assert [_text(m) for m in modules] == expected[id(program)]
        assert _text(program.module) == before[id(program)]
        graphs = {id(m.graph) for m in modules} | {id(program.module.graph)}
        assert len(graphs) == len(modules) + 1
        planned += len(modules)
    assert copies.count == planned
    kinds = {str(n.target) for p in plans.plans.values() for m in p.modules() for n in m.graph.nodes}
    assert any("gemv_linear" in k for k in kinds) and any("skinny" in k for k in kinds)
    windowed = core[1]
    assert any("rotary_fresh_attention" in k for k in kinds) != windowed
    assert any(plan.fresh for plan in plans.plans.values()) != windowed
    assert any("elementwise_run" in k for k in kinds) == runs


def test_a_rewrite_with_nothing_to_rewrite_or_given_its_own_copy_makes_no_copy(core, programs, monkeypatch):
    """The fresh rewrite of a graph whose every attention is windowed, and the runs of a graph without
    runs, return before copying; a rewrite given its own copy (`in_place`) changes it and returns it."""
    monkeypatch.setattr(elementwise_runs, "FUSE_RUNS", True)
    prompt = next(p for p in programs if cuda_graphs.wants_fresh_graph(p) and p.batch_capacity == 1)
    fused = cuda_graphs.rotary_module(prompt.module)
    owned = torch.fx.GraphModule(fused, copy.deepcopy(fused.graph))
    plain = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    plain.graph.output(plain.graph.placeholder("x"))
    copies = _Copies(monkeypatch)
    assert (cuda_graphs.fresh_module(fused) is None) == core[1]
    assert copies.count == (0 if core[1] else 1)
    copies.count = 0
    assert elementwise_runs.runs_module(plain) is plain
    text = str(owned.graph)
    assert cuda_graphs.gemv_module(owned, in_place=True) is owned and str(owned.graph) != text
    assert cuda_graphs.step_module(owned, DEVICE, in_place=True) is owned
    assert elementwise_runs.runs_module(owned, in_place=True) is owned and "elementwise_run" in str(owned.graph)
    assert copies.count == 0
