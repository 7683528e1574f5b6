"""The host validates every speculative completion before any lane retires: offers against the
lane's reserved ceiling and the aggregate P, the draft-cursor rule, and the emitted ids against
the record. A cohort the device rejects (ceilings beyond the lane limit) commits nothing and fails
the round. A failed round ends its lanes with an execution error naming the broken field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from helios.runtime.offline import generate
from ignition.hf_checkpoints import QWEN3, random_model, write_checkpoint

from .support import eager_model, eager_runtime, truncated

PLAN = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=16, decode_batches=(2,), mixed=False,
                    speculative=SpeculativePlan(Path("unused"), widths=(4,), allocate_prefixes=True, packed_per_lane=2))
PROMPTS = [[5, 9, 17, 3], [1, 2, 3]]
PROGRAM_INPUTS: list[str] = []  # the speculative program's input names, once loaded


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(QWEN3), tmp_path_factory.mktemp("qwen3")))


class Tampered(torch.nn.Module):
    """A program whose inputs or completion record are edited around the real one."""

    def __init__(self, module, edit_record=None, edit_inputs=None):
        super().__init__()
        self.inner, self.edit_record, self.edit_inputs = module, edit_record, edit_inputs

    def forward(self, *args):
        args = list(args)
        if self.edit_inputs is not None:
            self.edit_inputs(args)
        record, *rest = self.inner(*args)
        record = record.clone()
        if self.edit_record is not None:
            self.edit_record(record)
        return (record, *rest)


def run_tampered(recipe, **edits):
    model = eager_model(recipe, truncated(recipe, 1), PLAN)
    PROGRAM_INPUTS[:] = next(p.inputs for p in model.programs if p.speculative)
    programs = tuple(dataclasses.replace(p, module=Tampered(p.module, **edits)) if p.speculative else p
                     for p in model.programs)
    engine, _ = eager_runtime(dataclasses.replace(model, programs=programs))
    return generate(engine, PROMPTS, 6)


def test_untampered_rounds_complete(recipe):
    assert all(r.finish_reason.name == "LENGTH" for r in run_tampered(recipe))


def set_column(column, value):
    def edit(record):
        record[:2, column] = value
    return edit


@pytest.mark.parametrize("edit, field", [
    (set_column(4, 5), "offered"),  # above the lane's ceiling of 4
    (set_column(8, 0), "draft_cursor"),  # max(consumed - 0, 0) expected
    (lambda record: record.__setitem__((slice(0, 2), 10), (record[:2, 10] + 1) % 320), "tokens"),
])
def test_broken_records_fail_the_round(recipe, edit, field):
    results = run_tampered(recipe, edit_record=edit)
    assert all(r.finish_reason.name == "ERROR" for r in results)
    assert all(field in r.message for r in results), [r.message for r in results]


def test_offers_above_the_packed_capacity_fail_the_round(recipe):
    def edit(record):  # both lanes claim their full ceiling of 4: 8 > P = 4
        record[:2, 4] = 4
    results = run_tampered(recipe, edit_record=edit)
    assert all(r.finish_reason.name == "ERROR" and "packed capacity" in r.message for r in results)


def test_a_cohort_the_device_rejects_commits_nothing(recipe):
    def edit(args):  # ceilings above the program's lane limit (args[0] is the weight list)
        index = 1 + PROGRAM_INPUTS.index("lane_tokens")
        args[index] = torch.full_like(args[index], 9)

    counts = []

    def record_counts(record):
        counts.append(record[:2, 4:7].tolist())  # offered, accepted, emitted

    results = run_tampered(recipe, edit_inputs=edit, edit_record=record_counts)
    assert counts[0] == [[0, 0, 0], [0, 0, 0]]
    assert all(r.finish_reason.name == "ERROR" and "offered" in r.message for r in results)
