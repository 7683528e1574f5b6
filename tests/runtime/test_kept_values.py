"""Values a step need not rewrite (`helios.runtime.execution.kept_values`): through a stream of
steps over the example contract - mixed sampling parameters, row orders, a constrained step,
finished lanes, a slot taken by another request, graphs sharing buffers - a packer that skips
kept values leaves every buffer exactly as a packer that writes every binding every step."""

from __future__ import annotations

import json

import pytest
import torch

from contract.documents import example_doc
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.kept_values import KeptValues
from helios.runtime.execution.packer import Packer
from helios.runtime.loading.model import _DTYPES
from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import PlanRow, StepPlan
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams

STATE_ROWS = 2


class _Counting(KeptValues):
    """Counts the writes skipped."""

    skipped = 0

    def holds(self, binding, target, rows_key, constrained) -> bool:
        held = super().holds(binding, target, rows_key, constrained)
        self.skipped += held
        return held


class _WritesEverything(KeptValues):
    """The reference: holds nothing, so every binding is written every step."""

    def holds(self, binding, target, rows_key, constrained) -> bool:
        return False


@pytest.fixture(scope="module")
def prepared() -> PreparedContract:
    return PreparedContract.from_json(json.dumps(example_doc()))


def _packer(prepared: PreparedContract, reference: bool, staged: bool | None = None) -> tuple[Packer, dict[str, torch.Tensor]]:
    buffers = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role in (mpb.BUFFER_ROLE_INPUT, mpb.BUFFER_ROLE_PERSISTENT_STATE):
            shape = [dim.size if dim.WhichOneof("extent") == "size" else 8 * STATE_ROWS for dim in buffer.shape]
            buffers[buffer.name] = torch.zeros(shape, dtype=_DTYPES[buffer.dtype])
    table = torch.randn(65536, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    staging = host_staging(prepared, {"w.engram": table}, buffers)
    packer = Packer(prepared, buffers, state_rows=STATE_ROWS, host_staging=staging, staged=staged)
    written = packer._kept._program_written
    packer._kept = (_WritesEverything if reference else _Counting)(buffers, written)
    return packer, buffers


def _row(request_id: str, slot: int, generation: int, tokens, start: int, admits: bool = False,
         samples: bool = True, constrained: bool = False) -> PlanRow:
    return PlanRow(request_id, slot, generation, tuple(tokens), False, start, len(tokens), 0, (), samples,
                   max(start - 3, 0), 1 if samples else 0, admits, constrained)


SPECS = {
    "a": RequestSpec("a", (5, 6, 7, 8), 16, frozenset({128001, 128009})),
    "b": RequestSpec("b", (9, 10, 11), 12, frozenset({128009}),
                     sampling=SamplingParams(temperature=0.7, top_k=5, seed=12, repetition_penalty=1.2)),
    "c": RequestSpec("c", (1, 2, 3, 4, 5), 20, frozenset(), sampling=SamplingParams(top_p=0.5, seed=-3)),
}


def _steps(words: int):
    """(graph, plan) pairs: admissions, repeated decode cohorts, a constrained step and back, a
    swapped order, a finished lane, a slot taken again, a mixed step, a second decode graph."""
    mask = torch.zeros(words, dtype=torch.int32)
    mask[0] = 0b0110
    yield "prefill", [_row("a", 2, 1, (5, 6, 7, 8), 0, admits=True), _row("b", 5, 1, (9, 10, 11), 0, admits=True)], (), ("a", "b"), None
    for step in range(3):
        yield "decode", [_row("a", 2, 1, (40 + step,), 4 + step), _row("b", 5, 1, (50 + step,), 3 + step)], (), (), None
    yield "decode", [_row("a", 2, 1, (43,), 7), _row("b", 5, 1, (53,), 6, constrained=True)], (), (), {"b": mask}
    yield "decode", [_row("a", 2, 1, (44,), 8), _row("b", 5, 1, (54,), 7)], (), (), None
    yield "decode", [_row("b", 5, 1, (55,), 8), _row("a", 2, 1, (45,), 9)], (), (), None
    yield "decode", [_row("a", 2, 1, (46,), 10)], ("b",), (), None
    yield "prefill", [_row("c", 5, 2, (1, 2, 3), 0, admits=True, samples=False)], (), ("c",), None
    yield "mixed", [_row("a", 2, 1, (47,), 11), _row("c", 5, 2, (4, 5), 3)], (), (), None
    for step in range(2):
        yield "decode", [_row("a", 2, 1, (48 + step,), 12 + step), _row("c", 5, 2, (60 + step,), 5 + step)], (), (), None
    yield "decode_host_fed", [_row("a", 2, 1, (50,), 14), _row("c", 5, 2, (62,), 7)], (), (), None
    yield "decode", [_row("a", 2, 1, (51,), 15), _row("c", 5, 2, (63,), 8)], (), (), None


@pytest.mark.parametrize("staged", [None, True], ids=["in-place", "staged"])
def test_skipping_kept_values_leaves_every_buffer_as_writing_them_all(prepared, staged):
    """Staged: every per-step buffer is packed into one of two frames' mirrors (alternating, as two
    execution frames do) and uploaded; a kept binding skips both, the buffer keeping what the other
    frame's upload left there."""
    kept, kept_buffers = _packer(prepared, reference=False, staged=staged)
    every, every_buffers = _packer(prepared, reference=True, staged=staged)
    operations = {"prefill": Operation.PREFILL, "decode": Operation.DECODE, "decode_host_fed": Operation.DECODE,
                  "mixed": Operation.MIXED}
    for sequence, (graph, rows, finished, admitted, masks) in enumerate(_steps(kept_buffers["in.grammar_mask"].shape[1])):
        plan = StepPlan(sequence, sequence % 2, operations[graph], None, tuple(rows), (), sum(r.query_len for r in rows),
                        tuple(SPECS[name] for name in admitted), finished).with_masks(masks or {})
        for packer in (kept, every):
            packer.apply(plan)
            packer.pack(graph, plan)
            packer.retire(sequence)
        for name, tensor in every_buffers.items():
            assert torch.equal(kept_buffers[name], tensor), (sequence, graph, name)
    # The repeated cohorts' slots, generations, parameters and masks; staged, only the padded ones.
    assert kept._kept.skipped >= (4 if staged else 10)
    if staged:
        mirrors = kept._staging._mirror_sets
        assert mirrors[0] and all(name in mirrors[0] for name in ("in.slots", "in.generations"))


def test_a_repeated_decode_step_writes_only_what_changes(prepared, monkeypatch):
    """The second step of the same cohort writes positions and tokens, not slots or parameters."""
    packer, buffers = _packer(prepared, reference=False)
    steps = list(_steps(buffers["in.grammar_mask"].shape[1]))
    for sequence, (graph, rows, finished, admitted, masks) in enumerate(steps[:2]):
        plan = StepPlan(sequence, 0, Operation.PREFILL, None, tuple(rows), (), 1,
                        tuple(SPECS[name] for name in admitted), finished)
        packer.apply(plan)
        packer.pack(graph, plan)
        packer.retire(sequence)
    written = []
    original = Packer._fill
    monkeypatch.setattr(Packer, "_fill", lambda self, binding, *rest: (written.append(binding.buffer_name),
                                                                       original(self, binding, *rest)))
    graph, rows, *_ = steps[2]
    packer.pack(graph, StepPlan(2, 0, Operation.DECODE, None, tuple(rows), (), 2))
    assert "in.slots" not in written and "in.generations" not in written and "in.grammar_mask" not in written
    assert written, "the step's changing values are still written"
