"""Signing and checking the signed payload envelope.

A signature covers `DOMAIN || format_version (u32 LE) || payload`: the exact payload bytes, bound
to their payload format so a DeploymentBody signature cannot be replayed as a ModelIndex (or the
reverse). Every signature in an envelope must verify, in strictly increasing key id order (one
canonical envelope per set of signers); each carries its public key, so even a signature from a
key the operator does not trust is checked and a flipped byte anywhere in the envelope fails.
Trust (which of the valid signers counts) is decided by `authorize`.
"""

from __future__ import annotations

import struct
from typing import Iterable

from helios.contract import core_pb2
from helios.core.errors import BadSignatureError, UnsignedCoreError
from helios.core.keys import PublicKey, SigningKey, key_id_of

SIGNATURE_DOMAIN = b"helios.core.payload\x00"
MAX_SIGNATURES = 16


def signed_message(format_version: int, payload: bytes) -> bytes:
    return SIGNATURE_DOMAIN + struct.pack("<I", format_version) + payload


def sign(format_version: int, payload: bytes, key: SigningKey) -> core_pb2.Signature:
    return core_pb2.Signature(
        algorithm=core_pb2.SIGNATURE_ALGORITHM_ED25519,
        key_id=key.key_id,
        public_key=key.public.raw,
        signature=key.sign(signed_message(format_version, payload)),
    )


def seal(
    format_version: int, payload: bytes, keys: Iterable[SigningKey]
) -> core_pb2.SignedEnvelope:
    """An envelope over `payload` signed by each key, in order. Needs at least one key."""
    signatures = sorted(
        (sign(format_version, payload, key) for key in keys), key=lambda s: s.key_id
    )
    if not signatures:
        raise UnsignedCoreError("a core needs at least one signing key")
    return core_pb2.SignedEnvelope(payload=payload, signatures=signatures)


def check_signatures(
    format_version: int, envelope: core_pb2.SignedEnvelope
) -> tuple[PublicKey, ...]:
    """The signers of `envelope`, after every signature verified; raises SignatureError."""
    if not envelope.signatures:
        raise UnsignedCoreError("the core carries no signature")
    if len(envelope.signatures) > MAX_SIGNATURES:
        raise BadSignatureError(f"more than {MAX_SIGNATURES} signatures")
    message = signed_message(format_version, envelope.payload)
    signers: list[PublicKey] = []
    for index, entry in enumerate(envelope.signatures):
        if entry.algorithm != core_pb2.SIGNATURE_ALGORITHM_ED25519:
            raise BadSignatureError(f"signature {index}: unsupported algorithm {entry.algorithm}")
        if len(entry.public_key) != 32 or entry.key_id != key_id_of(entry.public_key):
            raise BadSignatureError(f"signature {index}: key id does not match its public key")
        signer = PublicKey(bytes(entry.public_key))
        if not signer.verify(entry.signature, message):
            raise BadSignatureError(
                f"signature {index} (key {entry.key_id.hex()}) does not verify over the payload"
            )
        if signers and signers[-1].key_id >= signer.key_id:
            raise BadSignatureError("signatures are not in strictly increasing key id order")
        signers.append(signer)
    return tuple(signers)


def signature_reports(
    format_version: int, envelope: core_pb2.SignedEnvelope
) -> tuple[tuple[bytes, bool], ...]:
    """(key id, verifies) for each signature, without raising; for unverified inspection. A signature
    whose key id does not follow the one before in strictly increasing order (a duplicate, or out of
    order) is reported as not verifying, since `check_signatures` refuses the core for it."""
    message = signed_message(format_version, envelope.payload)
    reports = []
    previous = None
    for entry in envelope.signatures:
        is_valid = (
            entry.algorithm == core_pb2.SIGNATURE_ALGORITHM_ED25519
            and len(entry.public_key) == 32
            and entry.key_id == key_id_of(entry.public_key)
            and (previous is None or previous < entry.key_id)
            and PublicKey(bytes(entry.public_key)).verify(entry.signature, message)
        )
        previous = bytes(entry.key_id)
        reports.append((previous, is_valid))
    return tuple(reports)
