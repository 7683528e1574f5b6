"""`helios inspect` against `verify` on the same core, found in session 72: each reported a core
"ok" (or crashed) where `verify` refuses it or where a core holds an optional section."""

from __future__ import annotations

import json

from helios.cli.main import main
from helios.core.inspection import inspect_core
from helios.core.keys import SigningKey

from .builders import craft_core, required_resources


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_reports_a_manifest_naming_a_resource_the_core_lacks(tmp_path, capsys):
    """`verify` exits 3 ("is not in the core") for this core, while `inspect` said "contract
    check: ok" (and `--json` a null contract_problem)."""
    missing = required_resources()[0][0]
    core = craft_core(tmp_path / "dangling.core", [SigningKey.generate()], {}, omit={missing})
    report = inspect_core(core)
    assert report.contract_problem is not None and f"{missing!r} is not in the core" in report.contract_problem
    code, out, _ = run(capsys, "inspect", core)
    assert code == 0 and "  contract check: ok" not in out.splitlines()
    assert f"  contract check: manifest.buffers[0].resource_id: resource {missing!r} is not in the core" in out
    code, out, _ = run(capsys, "inspect", core, "--json")
    assert code == 0 and f"{missing!r} is not in the core" in json.loads(out)["contract_problem"]


def test_inspect_still_says_ok_for_a_whole_core(small_core, capsys):
    code, out, _ = run(capsys, "inspect", small_core)
    assert code == 0 and "  contract check: ok" in out.splitlines()
    assert json.loads(run(capsys, "inspect", small_core, "--json")[1])["contract_problem"] is None
