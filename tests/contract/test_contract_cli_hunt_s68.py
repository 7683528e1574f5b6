"""Hostile contract files found in session 68: a binary bundle with a field repeated or unknown
(two bundles concatenated read as the second), an empty file and a JSON file behind a UTF-8 byte
order mark, each refused with exit 3 and one line that says what is wrong."""

from __future__ import annotations

import pytest

from contract.documents import example_text
from helios.cli.main import main
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract.files import load_bytes
from helios.errors import ContractError

EXAMPLE = PreparedContract.from_json(example_text())


def other_bundle() -> bytes:
    """A valid bundle of a different contract (the example with another served id)."""
    contract = type(EXAMPLE.contract)()
    contract.CopyFrom(EXAMPLE.contract)
    contract.served_id = "someone/else"
    return PreparedContract.from_messages(contract, EXAMPLE.manifest).to_bundle()


def test_a_bundle_with_a_field_repeated_is_refused(tmp_path, capsys):
    """Protobuf keeps the last of a repeated field: `cat a.bin b.bin` checked as b, silently."""
    both = EXAMPLE.to_bundle() + other_bundle()
    with pytest.raises(ContractError, match="more than once") as refused:
        load_bytes(both)
    assert refused.value.path == "bundle"
    path = tmp_path / "both.bin"
    path.write_bytes(both)
    code = main(["contract", "check", str(path)])
    captured = capsys.readouterr()
    assert code == 3 and captured.out == "" and captured.err.count("\n") == 1


def test_a_bundle_with_an_unknown_field_is_refused():
    """Bytes appended to a bundle that parse as an unknown field were skipped."""
    with pytest.raises(ContractError, match="unknown field number 15") as refused:
        load_bytes(EXAMPLE.to_bundle() + b"\x78\x01")
    assert refused.value.path == "bundle"
    assert load_bytes(EXAMPLE.to_bundle()) == EXAMPLE
    assert mpb.PreparedContractBundle.FromString(EXAMPLE.to_bundle()).contract == EXAMPLE.encode()[0]


@pytest.mark.parametrize("data", [b"", b" \n\t"])
def test_an_empty_file_is_called_empty(data):
    """It parsed as an empty bundle: 'contract.model: model contract is required'."""
    with pytest.raises(ContractError, match="the file is empty"):
        load_bytes(data)


def test_json_behind_a_byte_order_mark_is_named_as_such():
    """It was taken for a binary bundle: 'Wire format was corrupt'."""
    with pytest.raises(ContractError, match="byte order mark"):
        load_bytes(b"\xef\xbb\xbf" + example_text().encode())


@pytest.mark.parametrize(("data", "kind"), [(b"[]", "array"), (b' [{"contract": {}}]\n', "array"),
                                           (b"[1, 2", "array"), (b'"contract"', "string"), (b"null", "null")])
def test_json_that_is_not_an_object_is_named_as_such(data, kind, tmp_path, capsys):
    """JSON whose top level is not an object was taken for a binary bundle: 'Wire format was corrupt'."""
    with pytest.raises(ContractError, match=f"the file is a JSON {kind}; a JSON contract file is one object"):
        load_bytes(data)
    path = tmp_path / "c.json"
    path.write_bytes(data)
    code = main(["contract", "check", str(path)])
    captured = capsys.readouterr()
    assert code == 3 and captured.err.count("\n") == 1 and "Wire format" not in captured.err
    with pytest.raises(ContractError, match="Wire format was corrupt"):  # binary that is no JSON: as before
        load_bytes(b"\x00\x01" + data)
