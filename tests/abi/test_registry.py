"""Load-time validation of the `helios` ops a program uses."""

from __future__ import annotations

import contextlib
import io
import zipfile

import pytest
import torch

from helios.abi import completion, grammar, registry, rng, sampling
from helios.abi.program_image import PickledProgramError, encode_program
from helios.contract import core_pb2
from helios.errors import LoadError

DOCUMENTED = {
    "helios::philox4x32": "helios::philox4x32" + rng.PHILOX4X32_SCHEMA,
    "helios::philox_uniform": "helios::philox_uniform" + rng.PHILOX_UNIFORM_SCHEMA,
    "helios::apply_grammar_mask": "helios::apply_grammar_mask" + grammar.APPLY_GRAMMAR_MASK_SCHEMA,
    "helios::sample": "helios::sample" + sampling.SAMPLE_SCHEMA,
    "helios::completion_record": "helios::completion_record" + completion.COMPLETION_RECORD_SCHEMA,
}


@contextlib.contextmanager
def temporary_op(name: str, schema: str, mutates: bool = False):
    """Register ``helios::NAME`` for the duration of the block, then unregister it."""
    library = torch.library.Library("helios", "FRAGMENT")
    try:
        library.define(name + schema)
        if mutates:
            library.impl(name, lambda buffer, x: buffer.add_(x), "CompositeExplicitAutograd")
            torch.library.register_fake(f"helios::{name}", lambda buffer, x: None, lib=library)
        else:
            library.impl(name, lambda x, *rest: x * 2, "CompositeExplicitAutograd")
            torch.library.register_fake(f"helios::{name}", lambda x, *rest: torch.empty_like(x),
                                        lib=library)
        yield getattr(torch.ops.helios, name).default
    finally:
        library._destroy()


class _Calls(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x) + 1


def export(module: torch.nn.Module, *args) -> torch.export.ExportedProgram:
    return torch.export.export(module, args, strict=False)


def saved(program: torch.export.ExportedProgram) -> bytes:
    return encode_program(program)


class _AllOps(torch.nn.Module):
    def forward(self, logits, seeds, counters, mask, mask_rows, histogram):
        rows = logits.shape[0]
        masked = torch.ops.helios.apply_grammar_mask(logits, mask, mask_rows)
        zeros = torch.zeros_like(seeds)
        tokens = torch.ops.helios.sample(
            masked, seeds, counters, torch.ops.helios.philox_uniform(seeds, counters, 1),
            histogram[:, 0], torch.ones(rows), torch.zeros(rows), torch.ones(rows, 3),
            histogram, histogram, mask, mask_rows)
        words = torch.ops.helios.philox4x32(seeds, counters, 2)
        record = torch.ops.helios.completion_record(
            zeros, zeros, zeros[:1], tokens, zeros + 1, zeros, zeros + 1, counters + 1, None)
        return record, words


def all_ops_program() -> torch.export.ExportedProgram:
    rows, vocab = 3, 40
    args = (torch.randn(rows, vocab), torch.arange(rows), torch.zeros(rows, dtype=torch.int64),
            torch.full((rows, 2), -1, dtype=torch.int32), torch.ones(rows, dtype=torch.bool),
            torch.zeros(rows, vocab, dtype=torch.int32))
    return export(_AllOps(), *args)


def test_registered_schemas_hold_the_documented_abi():
    schemas = registry.registered_schemas()
    for name, schema in DOCUMENTED.items():
        assert schemas[name] == schema
    assert all(name.startswith("helios::") for name in schemas)


def test_program_ops_lists_every_helios_op_with_its_schema():
    assert registry.program_ops(all_ops_program()) == DOCUMENTED


def test_program_with_declared_registered_ops_passes():
    program = all_ops_program()
    registry.validate_program_ops(program, DOCUMENTED)
    extra = dict(DOCUMENTED, **{"helios::unused": "helios::unused(Tensor x) -> Tensor"})
    registry.validate_program_ops(program, extra)
    registry.validate_serialized_ops(saved(program), DOCUMENTED)


def test_undeclared_op_is_named():
    declared = {k: v for k, v in DOCUMENTED.items() if k != "helios::sample"}
    with pytest.raises(registry.UndeclaredOpError, match="helios::sample") as raised:
        registry.validate_program_ops(all_ops_program(), declared)
    assert raised.value.op == "helios::sample"
    with pytest.raises(registry.UndeclaredOpError, match="helios::sample"):
        registry.validate_serialized_ops(saved(all_ops_program()), declared)


def test_declared_schema_that_differs_from_registration_is_named():
    declared = dict(DOCUMENTED)
    declared["helios::philox4x32"] = "helios::philox4x32(Tensor seeds, Tensor counters) -> Tensor"
    with pytest.raises(registry.SchemaMismatchError, match="helios::philox4x32") as raised:
        registry.validate_program_ops(all_ops_program(), declared)
    assert raised.value.op == "helios::philox4x32"


def test_op_unknown_to_this_process_is_named():
    schema = "(Tensor x) -> Tensor"
    with temporary_op("test_vanishing", schema) as op:
        program = export(_Calls(op), torch.ones(2))
        data = saved(program)
    declared = {"helios::test_vanishing": "helios::test_vanishing" + schema}
    assert "helios::test_vanishing" not in registry.registered_schemas()
    with pytest.raises(registry.UnregisteredOpError, match="helios::test_vanishing"):
        registry.validate_program_ops(program, declared)
    assert registry.serialized_program_ops(data) == {"helios::test_vanishing"}
    with pytest.raises(registry.UnregisteredOpError, match="helios::test_vanishing"):
        registry.validate_serialized_ops(data, declared)


def test_program_exported_against_an_older_schema_is_rejected():
    old, new = "(Tensor x) -> Tensor", "(Tensor x, int scale=1) -> Tensor"
    with temporary_op("test_evolving", old) as op:
        program = export(_Calls(op), torch.ones(2))
    with temporary_op("test_evolving", new):
        declared = {"helios::test_evolving": "helios::test_evolving" + new}
        with pytest.raises(registry.SchemaMismatchError, match="exported with schema"):
            registry.validate_program_ops(program, declared)


class _Mutates(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, buffer, x):
        self.op(buffer, x)
        return x * 3


def test_ops_wrapped_by_higher_order_ops_are_found():
    schema = "(Tensor(a!) buffer, Tensor x) -> ()"
    with temporary_op("test_cache_write", schema, mutates=True) as op:
        program = export(_Mutates(op), torch.zeros(3), torch.ones(3)).run_decompositions()
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert not any("test_cache_write" in target for target in targets)  # wrapped, not direct
        assert registry.program_ops(program) == {
            "helios::test_cache_write": "helios::test_cache_write" + schema}
        assert registry.serialized_program_ops(saved(program)) == {"helios::test_cache_write"}


class _Branches(torch.nn.Module):
    def forward(self, x, seeds):
        def uses_op(x, seeds):
            return x + torch.ops.helios.philox_uniform(seeds, seeds, 0)

        def plain(x, seeds):
            return x - 1.0

        return torch.cond(x.sum() > 0, uses_op, plain, (x, seeds))


def test_ops_inside_subgraphs_are_found():
    program = export(_Branches(), torch.ones(3), torch.arange(3))
    assert set(registry.program_ops(program)) == {"helios::philox_uniform"}
    assert registry.serialized_program_ops(saved(program)) == {"helios::philox_uniform"}
    with pytest.raises(registry.UndeclaredOpError, match="philox_uniform"):
        registry.validate_program_ops(program, {})


def test_unreadable_saved_programs():
    with pytest.raises(registry.UnreadableProgramError):
        registry.serialized_program_ops(b"not a program image")
    with pytest.raises(registry.UnreadableProgramError, match="version 7"):
        registry.serialized_program_ops(core_pb2.ProgramImage(version=7).SerializeToString())
    with pytest.raises(registry.UnreadableProgramError, match="not JSON"):
        registry.serialized_program_ops(core_pb2.ProgramImage(version=1, exported_program=b"{").SerializeToString())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # what torch.export.save writes: refused unread
        archive.writestr("archive/version", "1")
    with pytest.raises(PickledProgramError, match="torch.export.save"):
        registry.serialized_program_ops(buffer.getvalue())


def test_error_families():
    for error in (registry.UndeclaredOpError, registry.UnregisteredOpError,
                  registry.SchemaMismatchError, registry.UnreadableProgramError):
        assert issubclass(error, LoadError)
    assert issubclass(registry.AbiArgumentError, ValueError)
