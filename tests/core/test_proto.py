"""core.proto conventions: a comment on every field and enum value, UNSPECIFIED zeros, and the
Python mirrors of its enums and format numbers."""

from __future__ import annotations

import re
from pathlib import Path

from helios.contract import core_pb2
from helios.core.records import FORMAT_LOGICAL_RESOURCE, FORMAT_PAYLOAD, CoreFormat, ResourceKind

CORE_PROTO = Path(__file__).resolve().parents[2] / "proto" / "helios" / "contract" / "core.proto"


def test_every_field_and_enum_value_has_a_comment():
    lines = CORE_PROTO.read_text().splitlines()
    declaration = re.compile(r"^\s+(repeated |optional )?[\w.]+ \w+ = \d+;|^\s+\w+ = \d+;")
    declarations = [n for n, line in enumerate(lines) if declaration.match(line)]
    assert len(declarations) > 50
    missing = [lines[n].strip() for n in declarations if not lines[n - 1].strip().startswith("//")]
    assert missing == []


def test_every_enum_has_an_unspecified_zero():
    enums = core_pb2.DESCRIPTOR.enum_types_by_name.values()
    assert {e.name for e in enums} == {"SignatureAlgorithm", "ResourceKind"}
    for enum in enums:
        assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.name


def test_python_mirrors_match_the_schema():
    schema = {
        value.name.removeprefix("RESOURCE_KIND_"): value.number
        for value in core_pb2.ResourceKind.DESCRIPTOR.values
        if value.number
    }
    assert schema == {kind.name: kind.value for kind in ResourceKind}
    assert (FORMAT_LOGICAL_RESOURCE, FORMAT_PAYLOAD) == (1, 2)
    assert {f.index_version for f in CoreFormat} == {None, 6, 4}
