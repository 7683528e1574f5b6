"""The committed descriptor snapshot (proto/descriptor_snapshot.json) matches the schema, and the
compatibility check rejects changes that alter a recorded number's meaning or remove it without
reserving it. The rejection cases compile edited copies of the real .proto files with protoc."""

from __future__ import annotations

import json
import shutil

import pytest

from contract.documents import REPO
from helios.contract.schema_snapshot import (
    SNAPSHOT,
    build_snapshot,
    compatibility_problems,
    compile_schema,
    render,
)

SCHEMA_DIR = REPO / "proto" / "helios" / "contract"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(SNAPSHOT.read_text())


@pytest.fixture(scope="module")
def current() -> dict:
    return build_snapshot(compile_schema())


def test_snapshot_is_current(recorded, current):
    assert compatibility_problems(recorded, current) == []
    assert render(current) == SNAPSHOT.read_text(), "run scripts/refresh_descriptor_snapshot.sh"


def test_snapshot_covers_every_proto_file(recorded):
    expected = sorted(f"helios/contract/{p.name}" for p in SCHEMA_DIR.glob("*.proto"))
    assert recorded["files"] == expected
    assert "helios.contract.ServingContract" in recorded["messages"]
    assert "helios.contract.ExecutionManifest" in recorded["messages"]


def edited_snapshot(tmp_path, old: str, new: str) -> dict:
    """Snapshot of the schema with `old` replaced by `new` in serving.proto (compiled by protoc)."""
    root = tmp_path / "proto"
    shutil.copytree(REPO / "proto" / "helios", root / "helios")
    serving = root / "helios" / "contract" / "serving.proto"
    text = serving.read_text()
    assert text.count(old) == 1, old
    serving.write_text(text.replace(old, new))
    return build_snapshot(compile_schema(root))


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("string served_id = 1;", "string served_name = 1;", "ServingContract field 1 changed meaning"),
        ("uint32 context_tokens = 4;", "uint64 context_tokens = 4;", "ServingContract field 4 changed meaning"),
        ("repeated string aliases = 2;", "string aliases = 2;", "ServingContract field 2 changed meaning"),
        ("optional double top_p = 2;", "double top_p = 2;", "SamplingDefaults field 2 changed meaning"),
        ("  repeated string aliases = 2;\n", "", "field 2 (aliases) was removed without reserving"),
        ("  repeated string aliases = 2;\n", "  reserved 2;\n", "field 2 (aliases) was removed without reserving"),
        ("  SEED_POLICY_FIXED = 2;\n", "  SEED_POLICY_CONSTANT = 2;\n", "SeedPolicy value 2 changed meaning"),
        ("  SEED_POLICY_FIXED = 2;\n", "", "SeedPolicy value 2 (SEED_POLICY_FIXED) was removed without reserving"),
        ("  HISTORY_KIND_RECURRENT = 4;\n", "  HISTORY_KIND_RECURRENT = 6;\n", "HistoryKind value 4"),
    ],
    ids=["rename", "retype", "relabel", "presence", "remove", "reserve-number-only", "enum-rename", "enum-remove", "enum-renumber"],
)
def test_incompatible_changes_are_rejected(tmp_path, recorded, old, new, problem):
    problems = compatibility_problems(recorded, edited_snapshot(tmp_path, old, new))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("  repeated string aliases = 2;\n", '  reserved 2;\n  reserved "aliases";\n'),
        ("  SEED_POLICY_FIXED = 2;\n", '  reserved 2;\n  reserved "SEED_POLICY_FIXED";\n'),
        ("  ModelContract model = 11;\n", "  ModelContract model = 11;\n  // New.\n  string note = 12;\n"),
    ],
    ids=["reserved-field", "reserved-value", "added-field"],
)
def test_compatible_changes_pass_but_need_a_refresh(tmp_path, recorded, old, new):
    changed = edited_snapshot(tmp_path, old, new)
    assert compatibility_problems(recorded, changed) == []
    assert render(changed) != render(recorded)


def test_removed_message_is_rejected(recorded, current):
    shrunk = json.loads(render(current))
    del shrunk["messages"]["helios.contract.AtomicSpan"]
    del shrunk["enums"]["helios.contract.ImageLayout"]
    problems = compatibility_problems(recorded, shrunk)
    assert any("message helios.contract.AtomicSpan was removed" in p for p in problems)
    assert any("enum helios.contract.ImageLayout was removed" in p for p in problems)
