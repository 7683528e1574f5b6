"""The semantic JSON form is read as standard JSON: a repeated key or a bare NaN/Infinity is an
error naming its path (Python's json module would keep the last key and accept the constants)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.documents import EXAMPLE, REPO, example_doc, example_text
from helios.cli.main import main
from helios.contract import PreparedContract
from helios.errors import ContractError

TEMPERATURE = '"temperature": 0.6'


def test_duplicate_top_level_key_is_refused():
    text = example_text().rstrip().removesuffix("}") + ', "contract": {}}'
    with pytest.raises(ContractError) as raised:
        PreparedContract.from_json(text)
    assert str(raised.value).startswith("contract: duplicate key")


def test_duplicate_nested_key_names_its_path():
    assert example_text().count(TEMPERATURE) == 1
    text = example_text().replace(TEMPERATURE, TEMPERATURE + ', "temperature": 0.7')
    with pytest.raises(ContractError) as raised:
        PreparedContract.from_json(text)
    assert "duplicate key" in str(raised.value)
    assert str(raised.value).split(":")[0].endswith(".sampling.temperature")


def test_duplicate_key_inside_an_array_element_names_the_index():
    doc = example_doc()
    graphs = doc["contract"]["model"]["graphs"]
    text = json.dumps(doc).replace(f'"name": "{graphs[1]["name"]}"',
                                   f'"name": "{graphs[1]["name"]}", "name": "x"', 1)
    with pytest.raises(ContractError) as raised:
        PreparedContract.from_json(text)
    assert str(raised.value).startswith("contract.model.graphs[1].name: duplicate key")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_bare_special_constants_are_refused_with_the_field(constant):
    text = example_text().replace(TEMPERATURE, f'"temperature": {constant}')
    with pytest.raises(ContractError) as raised:
        PreparedContract.from_json(text)
    message = str(raised.value)
    head = message.split(": ")[0]
    assert head.endswith(".sampling.temperature") and f"{constant} is not a JSON value" in message


def test_constant_inside_an_array_names_the_index():
    with pytest.raises(ContractError) as raised:
        PreparedContract.from_json('{"contract": {}, "manifest": {}, "x": [1, NaN]}')
    assert str(raised.value).startswith("x[1]: NaN is not a JSON value")


def test_cli_check_reports_a_duplicate_key_in_one_line_with_exit_3(tmp_path, capsys):
    bad = tmp_path / "dup.json"
    bad.write_text('{"contract": {}, "contract": {}, "manifest": {}}')
    code = main(["contract", "check", str(bad)])
    captured = capsys.readouterr()
    assert code == 3 and captured.out == ""
    assert captured.err.startswith("helios contract: error: contract: duplicate key") and captured.err.count("\n") == 1


def test_cli_check_reports_nan_in_one_line_with_exit_3(tmp_path, capsys):
    bad = tmp_path / "nan.json"
    bad.write_text(example_text().replace(TEMPERATURE, '"temperature": NaN'))
    code = main(["contract", "check", str(bad)])
    captured = capsys.readouterr()
    assert code == 3 and captured.out == ""
    first = captured.err.removeprefix("helios contract: error: ")
    assert first.split(": ")[0].endswith(".sampling.temperature") and "NaN is not a JSON value" in first
    assert captured.err.count("\n") == 1


def test_the_string_forms_of_special_doubles_still_parse():
    text = example_text().replace(TEMPERATURE, '"temperature": "NaN"')
    try:
        PreparedContract.from_json(text)
    except ContractError as error:  # a later semantic rule may refuse NaN; never the JSON reader
        assert "not a JSON value" not in str(error) and "duplicate key" not in str(error)


def test_every_contract_json_in_the_repository_still_parses():
    files = [EXAMPLE] + [p for p in (REPO / "tests").rglob("*.json") if _is_contract(p)]
    for path in files:
        PreparedContract.from_json(path.read_text())


def _is_contract(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        return False
    return isinstance(doc, dict) and set(doc) == {"contract", "manifest"}
