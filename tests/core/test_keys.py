"""Key files, key ids, trusted key sets and envelope signatures."""

from __future__ import annotations

import stat

import pytest

from helios.contract import core_pb2
from helios.core.envelope import check_signatures, seal, signature_reports
from helios.core.errors import BadSignatureError, KeyFileError, UnsignedCoreError
from helios.core.keys import (
    PublicKey,
    SigningKey,
    TrustedKeys,
    key_id_of,
    load_public_key,
    load_signing_key,
    parse_public_key,
    write_key_pair,
)


def test_key_pair_files_round_trip(tmp_path):
    key = SigningKey.generate()
    pub_path = write_key_pair(tmp_path / "pub.key", key, ["acme/models"])
    assert pub_path == tmp_path / "pub.key.pub"
    assert stat.S_IMODE((tmp_path / "pub.key").stat().st_mode) == 0o600
    loaded = load_signing_key(tmp_path / "pub.key")
    assert loaded.public.raw == key.public.raw
    public = load_public_key(pub_path)
    assert public.raw == key.public.raw
    assert public.namespaces == {"acme/models"}
    assert public.key_id == key.key_id == key_id_of(key.public.raw)
    assert len(public.key_id) == 16
    with pytest.raises(KeyFileError):
        write_key_pair(tmp_path / "pub.key", SigningKey.generate())  # never overwrites


def test_scopes():
    key = SigningKey.generate().public
    assert PublicKey(key.raw).admits("anything")
    scoped = PublicKey(key.raw, frozenset({"a"}))
    assert scoped.admits("a") and not scoped.admits("b") and not scoped.admits("A")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ssh-ed25519 AAAA",
        "helios-ed25519",
        "helios-ed25519 not-base64!",
        "helios-ed25519 " + "QUFB",  # 3 bytes
        "helios-ed25519 " + "A" * 44 + "\nhelios-ed25519 " + "A" * 44,
    ],
)
def test_malformed_public_keys(text):
    with pytest.raises(KeyFileError):
        parse_public_key(text)


def test_public_key_files_take_indented_comments_blank_lines_and_crlf():
    """Before: only a `#` in the first column began a comment, so an indented comment (an edited
    trust file) counted as a second key line: "expected exactly one key line"."""
    key = SigningKey.generate().public
    line = PublicKey(key.raw, frozenset({"acme/models"})).to_line().strip()
    text = f"  # publisher key, rotated 2026-12\r\n\r\n\t{line}  \r\n   \r\n    # kept until 2027\r\n \t\n"
    assert parse_public_key(text) == PublicKey(key.raw, frozenset({"acme/models"}))
    with pytest.raises(KeyFileError, match="expected exactly one key line"):
        parse_public_key(f"# two keys\n{line}\n  {line}\n")


def test_malformed_private_key(tmp_path):
    path = tmp_path / "k"
    path.write_text("not a key")
    with pytest.raises(KeyFileError):
        load_signing_key(path)
    with pytest.raises(KeyFileError):
        load_signing_key(tmp_path / "missing")


def test_trusted_keys_from_files_and_directories(tmp_path):
    keys = [SigningKey.generate() for _ in range(3)]
    (tmp_path / "trust").mkdir()
    for index, key in enumerate(keys[:2]):
        write_key_pair(tmp_path / "trust" / f"k{index}", key)
    write_key_pair(tmp_path / "lone", keys[2], ["ns"])
    trusted = TrustedKeys.from_paths([tmp_path / "trust", tmp_path / "lone.pub"])
    assert len(trusted) == 3
    assert trusted.get(keys[2].key_id).namespaces == {"ns"}
    assert trusted.get(SigningKey.generate().key_id) is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError):
        TrustedKeys.from_paths([tmp_path / "empty"])


def test_trusted_keys_merge_scopes():
    raw = SigningKey.generate().public.raw
    merged = TrustedKeys.of([PublicKey(raw, frozenset({"a"})), PublicKey(raw, frozenset({"b"}))])
    assert merged.get(key_id_of(raw)).namespaces == {"a", "b"}
    unscoped = TrustedKeys.of([PublicKey(raw, frozenset({"a"})), PublicKey(raw)])
    assert unscoped.get(key_id_of(raw)).namespaces == frozenset()


def test_envelope_signatures_bind_payload_and_format():
    keys = [SigningKey.generate() for _ in range(2)]
    envelope = seal(2, b"payload", keys)
    assert {s.raw for s in check_signatures(2, envelope)} == {k.public.raw for k in keys}
    with pytest.raises(BadSignatureError):
        check_signatures(1, envelope)  # the same bytes as another payload format
    tampered = core_pb2.SignedEnvelope()
    tampered.CopyFrom(envelope)
    tampered.payload = b"payloaD"
    with pytest.raises(BadSignatureError):
        check_signatures(2, tampered)
    assert [ok for _, ok in signature_reports(2, tampered)] == [False, False]
    with pytest.raises(UnsignedCoreError):
        check_signatures(2, core_pb2.SignedEnvelope(payload=b"payload"))


def test_envelope_signature_order_is_canonical():
    envelope = seal(2, b"payload", [SigningKey.generate() for _ in range(2)])
    swapped = core_pb2.SignedEnvelope(payload=envelope.payload)
    swapped.signatures.extend(reversed(envelope.signatures))
    with pytest.raises(BadSignatureError):
        check_signatures(2, swapped)
    doubled = core_pb2.SignedEnvelope(payload=envelope.payload)
    doubled.signatures.extend([envelope.signatures[0], envelope.signatures[0]])
    with pytest.raises(BadSignatureError):
        check_signatures(2, doubled)
    # inspect reports the signature that breaks the order as not verifying (it said "valid" to both)
    assert [ok for _, ok in signature_reports(2, swapped)] == [True, False]
    assert [ok for _, ok in signature_reports(2, doubled)] == [True, False]
    assert [ok for _, ok in signature_reports(2, envelope)] == [True, True]


def test_a_non_ascii_namespace_or_comment_round_trips_through_the_key_files(tmp_path):
    """Before: `helios keygen --namespace acmé/models` (a namespace `check_namespace` and `prepare`
    accept) failed with a UnicodeEncodeError traceback, and a .pub file with a UTF-8 comment could
    not be read at all."""
    key = SigningKey.generate()
    pub_path = write_key_pair(tmp_path / "k", key, ["acmé/models"])
    assert load_public_key(pub_path) == PublicKey(key.public.raw, frozenset({"acmé/models"}))
    commented = tmp_path / "commented.pub"
    commented.write_text("# clé de José\n" + key.public.to_line(), encoding="utf-8")
    assert load_public_key(commented) == key.public
