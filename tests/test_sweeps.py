"""The sweep switch: a sweep runs with its own variable set to 1 or with HELIOS_FULL_SUITE=1, not otherwise."""

from __future__ import annotations

import pytest

from support.sweeps import FULL_SUITE, in_sweep, swept


@pytest.mark.parametrize("own, full, expected", [
    (None, None, False), ("0", None, False), ("yes", None, False), ("1", None, True), (None, "1", True),
    ("0", "1", True), (None, "0", False),
])
def test_a_sweep_runs_with_its_variable_or_the_full_suite(monkeypatch, own, full, expected):
    for name, value in (("HELIOS_EXAMPLE_SWEEP", own), (FULL_SUITE, full)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert swept("HELIOS_EXAMPLE_SWEEP") is expected
    assert in_sweep("HELIOS_EXAMPLE_SWEEP", ("a",), ("b", "c")) == (("a", "b", "c") if expected else ("a",))
