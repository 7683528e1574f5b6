"""The wire schema's committed artifacts: generated Python equals a fresh protoc run, every enum
starts with an UNSPECIFIED zero, every field carries a comment, and the binding tables cover
every value source."""

from __future__ import annotations

import re
import subprocess

import pytest

from contract.documents import REPO
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.binding_rules import ALLOWED_INDEXING, SOURCE_OPERATIONS

SCHEMA_DIR = REPO / "proto" / "helios" / "contract"
GENERATED_DIR = REPO / "src" / "helios" / "contract"
OWN_PROTOS = ("serving.proto", "manifest.proto")


def test_regenerating_python_gives_identical_files(tmp_path):
    subprocess.run([str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, capture_output=True)
    generated = sorted((tmp_path / "helios" / "contract").iterdir())
    protos = sorted(SCHEMA_DIR.glob("*.proto"))
    assert {p.name for p in generated} == {f"{p.stem}_pb2{ext}" for p in protos for ext in (".py", ".pyi")}
    for fresh in generated:
        committed = GENERATED_DIR / fresh.name
        assert committed.exists(), f"{fresh.name} is not committed; run scripts/gen_proto.sh"
        assert committed.read_bytes() == fresh.read_bytes(), f"{fresh.name} is stale; run scripts/gen_proto.sh"


@pytest.mark.parametrize("module", [spb, mpb], ids=["serving", "manifest"])
def test_every_enum_has_unspecified_zero(module):
    for enum in module.DESCRIPTOR.enum_types_by_name.values():
        assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.name


@pytest.mark.parametrize("name", OWN_PROTOS)
def test_every_field_and_enum_value_has_a_comment(name):
    lines = (SCHEMA_DIR / name).read_text().splitlines()
    declaration = re.compile(r"^\s+(repeated |optional )?[\w.]+ \w+ = \d+;|^\s+\w+ = \d+;")
    declarations = [n for n, line in enumerate(lines) if declaration.match(line)]
    assert len(declarations) > 40
    for number in declarations:
        line = lines[number]
        assert lines[number - 1].strip().startswith("//"), f"{name}:{number + 1} lacks a comment: {line.strip()}"


def test_binding_tables_cover_every_source():
    sources = {v for v in spb.ValueSource.values() if v != spb.VALUE_SOURCE_UNSPECIFIED}
    assert set(ALLOWED_INDEXING) == sources
    assert set(SOURCE_OPERATIONS) <= sources
    assert all(ALLOWED_INDEXING[s] for s in sources)
