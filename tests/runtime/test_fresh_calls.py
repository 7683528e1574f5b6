"""`helios.runtime.loading.fresh_calls`: a long prompt program's fresh-chunk variant, and the steps the
executor replays it for (`program_variants.is_fresh_chunk`).

The rewrite turns each windowless, sinkless (rotary cache write, attention) pair - or fused call -
into ``helios::rotary_fresh_attention`` and leaves the rest. On a tiny random Llama core loaded the
way a CUDA model builds its programs, a stand-in "captured" executor replays each prompt program's
fresh variant for the steps `is_fresh_chunk` picks; every such step is also run on the program as
exported (on copies of every argument): the logits agree within 1e-4 and the completion records
(greedy tokens) and cache writes are equal; whole requests give the CPU path's tokens, cold prompts
(one chunk, several chunks) and prompts after a cached prefix alike.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

import helios.abi.fresh_attention  # noqa: F401 (registers the op)
import helios.runtime.loading.programs as program_loading
import helios.runtime.service as service
from helios.contract import serving_pb2 as spb
from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.execution.executor import GraphExecutor
from helios.runtime.execution.packer import Packer
from helios.runtime.execution.program_variants import is_fresh_chunk
from helios.runtime.loading.cuda_graphs import CapturedProgram
from helios.runtime.loading.fresh_calls import fresh_module, rewrite_fresh_attention, wants_fresh_graph
from helios.runtime.loading.model import program_arguments
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.plan import PlanRow, StepPlan
from helios.runtime.records.capacities import Operation
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import build_runtime
from runtime.test_greedy_rows_graph import NAMESPACE, greedy_rows_core

OPS = torch.ops.helios
PREFILL_TOKENS = 16  # the core's prompt step
_CHOOSER = random.Random(5)
_SHARED = [_CHOOSER.randrange(3, 300) for _ in range(40)]
# cold: one chunk, exactly the capacity, two chunks; then prompts reusing a cached prefix
PROMPTS = [[_CHOOSER.randrange(3, 300) for _ in range(n)] for n in (7, PREFILL_TOKENS, 2 * PREFILL_TOKENS - 3)]
PROMPTS += [_SHARED, _SHARED + [9, 8, 7]]
MAX_TOKENS = 6
LLAMA3_LAYERS = 2  # the tiny checkpoint's layers (tests/ignition/hf_checkpoints.py)


class _Replayed(CapturedProgram):
    """A captured program's stand-in: the exported module, and its fresh variant for fresh steps,
    each fresh step checked against the exported module on copies of the arguments."""

    def __init__(self, program, arguments):
        self.module, self.arguments = program.module, arguments
        self.fresh = fresh_module(program.module) if wants_fresh_graph(program, min_tokens=1) else None
        self.replays = {True: 0, False: 0}
        self.checked = 0

    def replay(self, greedy: bool, fresh: bool = False):
        use = fresh and self.fresh is not None
        self.replays[use] += 1
        if not use:
            return self.module(*self.arguments)
        copies = _copied(self.arguments)
        expected = self.module(*copies)
        got = self.fresh(*self.arguments)
        for want, have in zip(_flat(expected), _flat(got)):
            if want.is_floating_point():
                torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
            else:
                assert torch.equal(have, want)
        for want, have in zip(_flat(copies), _flat(self.arguments)):  # cache planes and state written alike
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
        self.checked += 1
        return got


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _flat(item)] if isinstance(value, (list, tuple)) else []


def _copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return type(value)(_copied(item) for item in value) if isinstance(value, (list, tuple)) else value


@pytest.fixture(scope="module")
def core_path(tmp_path_factory):
    # test_greedy_rows_graph's float32 Llama 3 core (prepared once per run; 16-token prompt steps)
    return greedy_rows_core(tmp_path_factory.getbasetemp(), "float32")


def _runtime(core_path):
    path, key = core_path
    return build_runtime(open_core(path, accept=NAMESPACE, trusted_keys=[key.public]))


def _serve(runtime) -> list[list[int]]:
    """Each prompt alone (its first step then holds only its rows)."""
    tokens: dict[str, list[int]] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)

    for index, prompt in enumerate(PROMPTS):
        tokens[f"r{index}"] = []
        runtime.engine.submit(EngineRequest(RequestSpec(f"r{index}", tuple(prompt), MAX_TOKENS), record))
        runtime.engine.run_until_idle()
    return [tokens[f"r{index}"] for index in range(len(PROMPTS))]


def test_fresh_steps_match_the_exported_program_and_the_cpu_tokens(core_path, monkeypatch):
    reference = _runtime(core_path)
    try:
        expected = _serve(reference)
    finally:
        reference.close()
    monkeypatch.setattr(program_loading, "cpu_program", lambda module: module)
    monkeypatch.setattr(service, "Packer", functools.partial(Packer, staged=True))
    runtime = _runtime(core_path)
    try:
        executor, model = runtime.engine.executor, runtime.engine.executor.model
        programs = {name: dataclasses.replace(p, module=_Replayed(p, program_arguments(p, model.weights,
                                                                                        model.buffers)))
                    for name, p in executor._programs.items()}
        runtime.engine.executor = GraphExecutor(model, executor.packer, programs)
        assert _serve(runtime) == expected
        with_fresh = [p.module for p in programs.values() if p.module.fresh is not None]
        assert with_fresh and all(p.operation != spb.GRAPH_OPERATION_DECODE for p in programs.values()
                                  if p.module.fresh is not None)
        for module in with_fresh:  # every layer's pair rewritten, no paged attention left
            targets = [n.target for n in module.fresh.graph.nodes if n.op == "call_function"]
            assert targets.count(OPS.rotary_fresh_attention.default) == LLAMA3_LAYERS
            assert not any("paged_attention" in str(target) for target in targets)
        # the three cold prompts' first chunks and the first shared prompt (nothing cached yet)
        assert sum(m.checked for m in with_fresh) == 4
        assert sum(m.replays[False] for m in with_fresh) >= 2  # later chunks, chunks after a cached prefix
    finally:
        runtime.close()


def _row(start_pos: int = 0, tokens: tuple = (5, 6, 7), pending: bool = False, query_len: int | None = None):
    return PlanRow("r", 0, 1, () if pending else tokens, pending, start_pos,
                   len(tokens) if query_len is None else query_len, 0, (1,), True, 0, 1, True, False)


def _plan(*rows) -> StepPlan:
    return StepPlan(1, 0, Operation.PREFILL, None, rows, (), sum(r.query_len for r in rows))


def test_fresh_chunks_are_one_row_from_position_0():
    assert is_fresh_chunk(_plan(_row()))
    assert not is_fresh_chunk(_plan(_row(start_pos=16)))  # a cached prefix or an earlier chunk
    assert not is_fresh_chunk(_plan(_row(), _row()))  # two prompts share the step
    assert not is_fresh_chunk(_plan(_row(tokens=(5,), pending=True, query_len=1)))
    assert not is_fresh_chunk(_plan())


@dataclasses.dataclass
class _Program:
    operation: int
    batch_capacity: int
    packed_token_capacity: int
    speculative: object = None


def test_long_prompt_programs_want_fresh_graphs():
    assert wants_fresh_graph(_Program(spb.GRAPH_OPERATION_PREFILL, 1, 2048))
    assert wants_fresh_graph(_Program(spb.GRAPH_OPERATION_MIXED, 8, 1024))
    assert not wants_fresh_graph(_Program(spb.GRAPH_OPERATION_PREFILL, 1, 512))
    assert wants_fresh_graph(_Program(spb.GRAPH_OPERATION_PREFILL, 1, 512), min_tokens=512)
    assert not wants_fresh_graph(_Program(spb.GRAPH_OPERATION_DECODE, 2048, 2048))
    assert not wants_fresh_graph(_Program(spb.GRAPH_OPERATION_SPECULATIVE, 4, 2048, speculative=object()))


HEADS, KV_HEADS, DIM, TOKENS = 4, 2, 8, 6


class _Layers(torch.nn.Module):
    """Layers: plain, tuned, with a window, with sinks, and one fused call with a prefetch hint."""

    def forward(self, qkv, cos, sin, k_cache, v_cache, slots, table, starts, positions, sinks, splits):
        outs = []
        for layer in range(5):
            q, k, v = (qkv * (layer + 1)).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1)
            q, k, v = q.reshape(TOKENS, HEADS, DIM), k.reshape(TOKENS, KV_HEADS, DIM), v.reshape(TOKENS, KV_HEADS, DIM)
            planes = (k_cache[layer], v_cache[layer])
            if layer == 4:
                outs.append(OPS.rotary_paged_attention(q, k, v, cos, sin, *planes, slots, table, starts, positions,
                                                       0.35, 0, None, splits, qkv))
                continue
            q = OPS.rotary_cache_write(q, k, v, cos, sin, *planes, slots)
            geometry = (q, *planes, table, starts, positions, 0.35)
            if layer == 0:
                outs.append(OPS.paged_attention(*geometry, 0))
            elif layer == 1:
                outs.append(OPS.paged_attention_tuned(*geometry, 0, splits))
            elif layer == 2:
                outs.append(OPS.paged_attention(*geometry, 3))
            else:
                outs.append(OPS.paged_attention_sinks(*geometry, 0, sinks))
        return torch.stack(outs)


def _inputs():
    generator = torch.Generator().manual_seed(1)
    positions = torch.arange(TOKENS)
    angles = positions[:, None].float() * torch.rand(DIM // 2, generator=generator)
    angles = torch.cat([angles, angles], -1)
    table = torch.tensor([[3, 0]], dtype=torch.int32)
    slots = table[0][positions // 4].long() * 4 + positions % 4
    cache = torch.randn(5, 4, 4, KV_HEADS, DIM, generator=generator)
    return (torch.randn(TOKENS, (HEADS + 2 * KV_HEADS) * DIM, generator=generator), angles.cos()[:, None],
            angles.sin()[:, None], cache, cache.clone() + 1, slots, table, torch.tensor([0, TOKENS], dtype=torch.int32),
            positions, torch.randn(HEADS, generator=generator), torch.tensor([2], dtype=torch.int32))


def test_windowless_sinkless_pairs_and_fused_calls_are_rewritten():
    module = torch.export.export(_Layers(), _inputs(), strict=False).module()
    fresh = fresh_module(module)
    targets = [n.target for n in fresh.graph.nodes if n.op == "call_function"]
    assert targets.count(OPS.rotary_fresh_attention.default) == 3  # plain, tuned, the fused call
    assert targets.count(OPS.paged_attention.default) == 1 and targets.count(OPS.paged_attention_sinks.default) == 1
    assert targets.count(OPS.rotary_cache_write.default) == 2 and OPS.rotary_paged_attention.default not in targets
    inputs, copies = _inputs(), _inputs()
    torch.testing.assert_close(fresh(*inputs), module(*copies), rtol=1e-5, atol=1e-5)
    assert torch.equal(inputs[3], copies[3]) and torch.equal(inputs[4], copies[4])
    assert rewrite_fresh_attention(fresh.graph) == 0  # nothing left
    assert fresh_module(fresh) is None and fresh_module(object()) is None
