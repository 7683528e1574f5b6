"""History drafting on the host: the candidate index, and the packer's copied-token sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract import StartupOptions
from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.records.capacities import Operation
from helios.runtime.execution.geometry import program_variant
from helios.runtime.execution.history_drafting import HistoryIndex
from helios.runtime.execution.packer import AdmissionValues, Packer
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan
from ignition.hf_checkpoints import LLAMA3, random_model, write_checkpoint

from .support import eager_model


def test_the_longest_suffix_seen_before_is_continued():
    history = HistoryIndex([1, 2, 3, 4, 9, 9, 2, 3, 4, 5, 8, 3, 4])
    assert history.candidates(3) == (5, 8, 3)  # only (3, 4) was seen before; its latest continuation
    history.extend([5])
    assert history.candidates(2) == (8, 3)  # suffix (3, 4, 5) was followed by 8


def test_longer_matches_win_over_more_recent_shorter_ones():
    history = HistoryIndex([7, 1, 2, 3, 50, 1, 2, 60, 7, 1, 2, 3])
    assert history.candidates(1) == (50,)  # (1, 2, 3) beats the later (1, 2) -> 60


def test_a_repeating_history_is_continued_past_its_end():
    history = HistoryIndex([4, 4, 4, 4, 4])
    assert history.candidates(3) == (4, 4, 4)
    cycle = HistoryIndex([1, 2, 3, 1, 2, 3, 1, 2])
    assert cycle.candidates(5) == (3, 1, 2, 3, 1)


def test_nothing_is_proposed_without_a_match_or_a_budget():
    assert HistoryIndex([1, 2, 3, 4]).candidates(4) == ()
    assert HistoryIndex([1, 2, 1, 2]).candidates(0) == ()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    recipe = load_checkpoint(write_checkpoint(random_model(LLAMA3), tmp_path_factory.mktemp("llama3")))
    plan = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=16, decode_batches=(4,),
                        speculative=SpeculativePlan(Path("unused"), widths=(4,)))
    return eager_model(recipe, recipe, plan, StartupOptions(history_drafting=True))


def speculative_plan(model, rows) -> StepPlan:
    variant = next(p for p in model.programs if p.speculative)
    tokens = sum(r.query_len for r in rows)
    return StepPlan(1, 1, Operation.SPECULATIVE, program_variant(variant), tuple(rows), (), tokens)


def lane(request_id, slot, pending, start, ceiling=4) -> PlanRow:
    return PlanRow(request_id, slot, 1, (pending,), False, start, ceiling, 0, (), True, 0, ceiling, False, False)


def test_the_packer_copies_candidates_for_lanes_whose_history_ends_at_their_pending_token(model):
    packer = Packer(model.prepared, model.buffers, 1, history_drafting=True)
    prompt = (5, 6, 7, 8, 5, 6)
    for request_id in ("a", "b", "c"):
        packer.register(request_id, AdmissionValues(prompt, 0, (0.0,) * 7, 10))
    first = StepPlan(0, 0, Operation.PREFILL, None, (lane("a", 0, 6, 0), lane("b", 1, 6, 0), lane("c", 2, 6, 0)), (), 3)
    packer.observe(first, [RowResult(s, 1, 7, (7,)) for s in range(3)])  # every history: prompt + 7
    plan = speculative_plan(model, [lane("a", 0, 7, 6), lane("b", 1, 9, 6), lane("c", 2, 7, 6, ceiling=2)])
    packer.pack("speculative", plan)
    ids, counts, endpoints = (model.buffers[name] for name in ("copied_ids", "copied_counts", "copied_endpoints"))
    assert counts[:3].tolist() == [3, 0, 1]  # b's pending token is not its history's last; c's ceiling is 2
    assert ids[0].tolist() == [8, 5, 6] and ids[1].tolist() == [-1, -1, -1] and ids[2].tolist() == [8, -1, -1]
    assert endpoints[:3].tolist() == [6, 6, 6]
    assert counts[3:].tolist() == [0] * (counts.shape[0] - 3)


def test_without_history_drafting_no_candidates_are_copied(model):
    packer = Packer(model.prepared, model.buffers, 1)
    packer.register("a", AdmissionValues((5, 6, 7, 5, 6), 0, (0.0,) * 7, 10))
    packer.pack("speculative", speculative_plan(model, [lane("a", 0, 7, 5)]))
    assert model.buffers["copied_counts"][0].item() == 0
