"""Signed decoded lengths are bounded by the stored frame and by memory before anything is
allocated: a trusted signer's absurd `decoded_nbytes` is a typed error, for every command."""

from __future__ import annotations

import pytest

from helios.cli.main import main
from helios.core import streams
from helios.core.errors import DecodedSizeError, ResourceTooLargeError
from helios.core.reader import open_core
from helios.core.zstd_frame import MAX_BLOCK_NBYTES, max_decoded_nbytes

from .builders import NAMESPACE, craft_core, zstd_frame


def test_the_decoded_bound_is_the_rle_block_ratio():
    assert max_decoded_nbytes(4) == MAX_BLOCK_NBYTES
    assert max_decoded_nbytes(4096) == 1024 * MAX_BLOCK_NBYTES
    assert max_decoded_nbytes(3) == 0


@pytest.mark.parametrize("decoded", [2**63, 2**64 - 1, 10**15])
def test_an_absurd_signed_decoded_length_is_refused_at_open(tmp_path, key, decoded):
    path = craft_core(tmp_path / "absurd.core", [key], {"hostile": (zstd_frame(b"hello world"), decoded)})
    with pytest.raises(DecodedSizeError, match="cannot decode"):
        open_core(path, accept=NAMESPACE, trusted_keys=[key.public])


@pytest.mark.parametrize("command", ["verify", "inspect", "generate", "serve"])
def test_commands_report_an_absurd_decoded_length_in_one_line(tmp_path, key, capsys, command):
    path = craft_core(tmp_path / "absurd.core", [key], {"hostile": (zstd_frame(b"hello world"), 2**63)})
    public = tmp_path / "key.pub"
    public.write_text(key.public.to_line() + "\n")
    trust = [] if command == "inspect" else ["--accept", NAMESPACE, "--trust", str(public)]
    extra = ["hello"] if command == "generate" else ["--port", "0"] if command == "serve" else []
    code = main([command, str(path), *trust, *extra])
    _out, err = capsys.readouterr()
    assert code == DecodedSizeError.exit_code and "Traceback" not in err
    assert err.count("\n") == 1 and "cannot decode" in err


def test_a_resource_larger_than_available_memory_is_refused_before_allocating(tmp_path, key, monkeypatch):
    path = craft_core(tmp_path / "big.core", [key], {"hostile": (zstd_frame(b"hello world"), 11)})
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    monkeypatch.setattr(streams, "available_memory_nbytes", lambda: 10)
    with pytest.raises(ResourceTooLargeError, match="resource 'hostile' decodes to 11 bytes"):
        core.read_resource("hostile")
    monkeypatch.setattr(streams, "available_memory_nbytes", lambda: None)
    assert core.read_resource("hostile") == b"hello world"
