"""`helios contract check|show|encode` through the real dispatcher (main(argv)) and, once, as
the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from contract.documents import EXAMPLE, REPO, example_doc, example_text, graph
from helios.cli.main import main
from helios.contract import PreparedContract


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_example(capsys):
    code, out, err = run(["contract", "check", str(EXAMPLE)], capsys)
    assert code == 0 and err == ""
    assert out.startswith("ok: example/llama-3.1-8b-vision-instruct (contract v3; 11 graphs")


def test_check_refuses_what_the_runtime_does_not_serve_with_its_path(tmp_path, capsys):
    """Servability is part of validation: `check` answers what loading would."""
    doc = example_doc()
    prefill, path = graph(doc, "prefill")
    index = next(i for i, b in enumerate(prefill["bindings"]) if b["source"] == "VALUE_SOURCE_PROMPT_HISTOGRAM")
    prefill["bindings"][index]["indexing"] = "INDEXING_SUBMISSION_ROW"  # valid, but histograms are per slot
    bad = tmp_path / "histogram.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run(["contract", "check", str(bad)], capsys)
    assert code == 8 and out == ""
    assert err.startswith(f"helios contract: error: {path}.bindings[{index}].indexing: PROMPT_HISTOGRAM values are "
                          "not supplied")


def test_show_prints_canonical_json(capsys):
    code, out, _ = run(["contract", "show", str(EXAMPLE)], capsys)
    assert code == 0 and out == example_text()


def test_show_settings(capsys):
    code, out, _ = run(["contract", "show", "--settings", str(EXAMPLE)], capsys)
    settings = json.loads(out)
    assert code == 0 and settings["max_concurrency"] == 64 and settings["sampling"]["top_k"] == 50


def test_encode_then_check_and_show_binary(tmp_path, capsys):
    binary = tmp_path / "contract.bin"
    code, out, _ = run(["contract", "encode", str(EXAMPLE), str(binary)], capsys)
    assert code == 0 and binary.read_bytes() == PreparedContract.from_json(example_text()).to_bundle()
    assert run(["contract", "check", str(binary)], capsys)[0] == 0
    code, out, _ = run(["contract", "show", str(binary)], capsys)
    assert code == 0 and out == example_text()


def test_invalid_contract_is_one_line_with_path_and_exit_code(tmp_path, capsys):
    doc = example_doc()
    doc["contract"]["model"]["version"] = 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run(["contract", "check", str(bad)], capsys)
    assert code == 3 and out == ""
    assert err == "helios contract: error: contract.model.version: unsupported contract version 7 (supported: 1, 2, 3)\n"


def test_garbage_file(tmp_path, capsys):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00\xff\xfe garbage")
    code, _, err = run(["contract", "show", str(bad)], capsys)
    assert code == 3 and err.count("\n") == 1 and "bundle" in err


def test_missing_file(tmp_path, capsys):
    code, _, err = run(["contract", "check", str(tmp_path / "absent.json")], capsys)
    assert code == 2 and err.startswith("helios contract: error: cannot read") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["contract", "--help"], ["contract", "check", "--help"], ["contract", "show", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert "FILE" in capsys.readouterr().out or argv == ["contract", "--help"]


def test_missing_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["contract"])
    assert exited.value.code == 2


def test_console_script_reads_stdin():
    script = REPO / ".venv" / "bin" / "helios"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "helios.cli.main"]
    result = subprocess.run(command + ["contract", "check", "-"], input=example_text(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")
