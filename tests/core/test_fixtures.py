"""Committed cores of every carrier still read: engine upgrades keep loading what earlier versions
wrote, without re-export. The fixture files are never regenerated to make this test pass."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helios.core.aead import load_aead_key
from helios.core.inspection import inspect_core
from helios.core.keys import TrustedKeys
from helios.core.reader import open_core
from helios.core.records import CoreFormat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cores"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def trust():
    return TrustedKeys.from_paths([FIXTURES / "TEST-ONLY-signing.key.pub"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_core_reads(name, trust):
    expected = EXPECTED[name]
    core = open_core(
        FIXTURES / name,
        accept=expected["namespace"],
        trusted_keys=trust,
        aes_key=load_aead_key(FIXTURES / "TEST-ONLY-aes.key"),
    )
    assert core.core_format is CoreFormat[expected["format"]]
    listed = [
        {"id": r.id, "kind": r.kind.name, "rank": r.rank, "stored_nbytes": r.stored_nbytes,
         "decoded_nbytes": r.decoded_nbytes}
        for r in core.resources
    ]
    assert listed == [{k: v for k, v in r.items() if k != "sha256"} for r in expected["resources"]]
    for resource in expected["resources"]:
        digest = hashlib.sha256(core.read_resource(resource["id"])).hexdigest()
        assert digest == resource["sha256"], resource["id"]
    assert core.prepared.encode()  # the contract decodes and validates with today's rules
    assert core.rebuild is not None and core.rebuild.recipe == "fixture"
    assert [c.resource_id for c in core.weight_catalogs] == ["weights/rank0/embed"]


def test_every_carrier_has_a_fixture():
    assert {entry["format"] for entry in EXPECTED.values()} == {f.name for f in CoreFormat}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_inspects_without_trust(name):
    report = inspect_core(FIXTURES / name)
    assert report.is_verified is False
    assert report.contract_problem is None and report.location_problem is None
    assert report.ignored_catalogs == 1
    assert [s.is_valid for s in report.signatures] == [True]
