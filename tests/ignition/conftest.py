"""Shared fixtures: each family's tiny checkpoint is built, prepared and captured once per session."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helios.ignition.capture import CapturedProgram, capture_program, load_program
from helios.ignition.program_spec import Capacity, Operation
from helios.ignition.recipes import Recipe, load_checkpoint

from support.chat_checkpoint import write_chat_checkpoint
from support.sweeps import swept

from .hf_checkpoints import QWEN3, Family, random_model, write_checkpoint

PAGE_TOKENS = 4
VARIANTS = (
    (Operation.PREFILL, Capacity(2, 32)),
    (Operation.DECODE, Capacity(4, 4)),
    (Operation.MIXED, Capacity(4, 32)),
    (Operation.SCORED_PREFILL, Capacity(2, 32)),
)
ALL_OPERATIONS = tuple(op for op, _ in VARIANTS)
# What `prepare` captures unless asked for more: the driver runs every step of the checks against
# transformers through MIXED when PREFILL / DECODE are not captured, and scores through SCORED_PREFILL.
# test_equivalence's own families (and tests/gpu's family checks) keep the PREFILL and DECODE programs.
CHECK_OPERATIONS = (Operation.MIXED, Operation.SCORED_PREFILL)
# What a family module's `prepare(family)` captures: MIXED alone, and SCORED_PREFILL too with
# HELIOS_EQUIVALENCE_SWEEP=1, which runs FamilyChecks' scored check (see test_equivalence.FamilyChecks).
FAMILY_OPERATIONS = CHECK_OPERATIONS if swept("HELIOS_EQUIVALENCE_SWEEP") else (Operation.MIXED,)


@contextlib.contextmanager
def single_thread():
    """Tiny tensors: intra-op threads only add contention on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def one_thread():
    with single_thread():
        yield


@dataclass
class Prepared:
    """A family's reference model, its recipe, captured programs (bytes) and loaded modules."""

    family: Family
    reference: torch.nn.Module
    recipe: Recipe
    captured: dict[Operation, CapturedProgram]
    programs: dict[Operation, tuple]  # {operation: (ProgramSpec, loaded module)}

    def capture(self, operations) -> None:
        """Capture and load the `operations` (of VARIANTS) not captured yet; both dicts stay in VARIANTS' order."""
        missing = [(op, capacity) for op, capacity in VARIANTS if op in operations and op not in self.captured]
        if not missing:
            return
        arch = self.recipe.architecture
        self.captured.update({op: capture_program(arch, op, capacity, PAGE_TOKENS) for op, capacity in missing})
        self.programs.update({op: (self.captured[op].spec, load_program(self.captured[op].program))
                              for op, _ in missing})
        self.captured = {op: self.captured[op] for op in ALL_OPERATIONS if op in self.captured}
        self.programs = {op: self.programs[op] for op in ALL_OPERATIONS if op in self.programs}


@pytest.fixture(scope="session")
def prepare(tmp_path_factory):
    """`prepare(family)`: the family's Prepared, its reference and checkpoint built once per session and
    its `operations` (FAMILY_OPERATIONS unless given; ALL_OPERATIONS for every program of VARIANTS) captured."""
    cache: dict[str, Prepared] = {}

    def get(family: Family, operations=FAMILY_OPERATIONS) -> Prepared:
        with single_thread():
            if family.name not in cache:
                cache[family.name] = _prepare(family, tmp_path_factory.mktemp(family.name))
            cache[family.name].capture(operations)
        return cache[family.name]

    return get


def _prepare(family: Family, directory) -> Prepared:
    reference = random_model(family)
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    recipe = load_checkpoint(write_checkpoint(reference, directory))
    return Prepared(family, reference, recipe, {}, {})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tiny Qwen3 chat checkpoint (weights, tokenizer, template) that tests copy, never change."""
    return write_chat_checkpoint(QWEN3, tmp_path_factory.mktemp("chat") / "checkpoint", seed=3)


@pytest.fixture
def checkpoint(pristine, tmp_path) -> Path:
    """A copy of `pristine` this test may damage."""
    return Path(shutil.copytree(pristine, tmp_path / "checkpoint"))
