"""A core that is valid by the specification but declares what this runtime does not serve is read,
verified and inspected, and refused when loaded, with the field path of the first such declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract.servable import NotServableError
from helios.core.aead import load_aead_key
from helios.core.inspection import inspect_core
from helios.core.keys import TrustedKeys
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cores"


def test_a_valid_core_with_restoration_graphs_reads_and_is_refused_at_load():
    core = open_core(
        FIXTURES / "logical_v4.core",
        accept="test.helios/fixtures",
        trusted_keys=TrustedKeys.from_paths([FIXTURES / "TEST-ONLY-signing.key.pub"]),
        aes_key=load_aead_key(FIXTURES / "TEST-ONLY-aes.key"),
    )
    assert inspect_core(FIXTURES / "logical_v4.core").contract_problem is None
    with pytest.raises(NotServableError) as caught:
        load_model(core, LoadOptions(device="cpu"))
    assert caught.value.path.startswith("contract.model.graphs[")
    assert "RESTORATION graphs are not served" in str(caught.value)
