"""The authenticated AES-GCM chunk reader (and writer) of ProtectedIndex version 4.

A v4 resource is its plaintext cut into 4 MiB chunks (at least one, so an empty resource still has
an authenticated final chunk), each sealed with AES-256-GCM under the operator's key:

- nonce = the resource's 8-byte signed nonce prefix + the chunk index (4 bytes, big-endian);
- associated data = a domain tag, the resource id, the chunk index and a final-chunk flag.

So a flipped byte, a chunk moved to another position or another resource, a dropped final chunk
and a wrong key all fail authentication (`ChunkAuthenticationError`) before any plaintext of that
chunk is released. Stored length = plaintext length + 16 bytes per chunk.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from helios.core.chunks import CHUNK_NBYTES, RangeFile
from helios.core.errors import ChunkAuthenticationError, DecodedLengthError, KeyFileError

AEAD_KEY_NBYTES = 32
TAG_NBYTES = 16
NONCE_PREFIX_NBYTES = 8
_AAD_DOMAIN = b"helios.v4.chunk\x00"


def aead_chunk_count(decoded_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    return max(1, -(-decoded_nbytes // chunk_nbytes))


def aead_stored_nbytes(decoded_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    return decoded_nbytes + TAG_NBYTES * aead_chunk_count(decoded_nbytes, chunk_nbytes)


def _nonce(prefix: bytes, index: int) -> bytes:
    return prefix + struct.pack(">I", index)


def _aad(resource_id: str, index: int, is_final: bool) -> bytes:
    name = resource_id.encode()
    return _AAD_DOMAIN + struct.pack(">H", len(name)) + name + struct.pack(">IB", index, is_final)


def check_aead_key(key: bytes) -> bytes:
    if len(key) != AEAD_KEY_NBYTES:
        raise KeyFileError(f"an AES-256 key is {AEAD_KEY_NBYTES} bytes, not {len(key)}")
    return bytes(key)


def _read_full(source: BinaryIO, nbytes: int) -> bytes:
    parts, missing = [], nbytes
    while missing:
        part = source.read(missing)
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)


@dataclass(frozen=True)
class StoredAead:
    stored_nbytes: int
    decoded_nbytes: int


def write_aead_resource(
    source: BinaryIO,
    sink: BinaryIO,
    *,
    key: bytes,
    resource_id: str,
    nonce_prefix: bytes,
    chunk_nbytes: int = CHUNK_NBYTES,
) -> StoredAead:
    """Seals everything `source` yields into `sink` as v4 chunks. Reads `source` to EOF."""
    aead = AESGCM(check_aead_key(key))
    if len(nonce_prefix) != NONCE_PREFIX_NBYTES:
        raise ValueError(f"a nonce prefix is {NONCE_PREFIX_NBYTES} bytes")
    index, stored, decoded = 0, 0, 0
    current = _read_full(source, chunk_nbytes)
    while True:
        following = _read_full(source, chunk_nbytes) if len(current) == chunk_nbytes else b""
        sealed = aead.encrypt(
            _nonce(nonce_prefix, index), current, _aad(resource_id, index, not following)
        )
        sink.write(sealed)
        stored, decoded, index = stored + len(sealed), decoded + len(current), index + 1
        if not following:
            return StoredAead(stored, decoded)
        current = following


class AeadChunkReader(io.RawIOBase):
    """A read-only stream of one v4 resource's plaintext, authenticated chunk by chunk.

    Owns `source` and closes it on `close()`. `decoded_nbytes` and `nonce_prefix` come from the
    signed index; the stored range length must equal `aead_stored_nbytes(decoded_nbytes)`.
    """

    def __init__(
        self,
        source: RangeFile,
        *,
        key: bytes,
        resource_id: str,
        decoded_nbytes: int,
        nonce_prefix: bytes,
        chunk_nbytes: int = CHUNK_NBYTES,
    ):
        super().__init__()
        if source.nbytes != aead_stored_nbytes(decoded_nbytes, chunk_nbytes):
            raise DecodedLengthError(f"resource {resource_id!r}: stored length does not fit")
        self._source = source
        self._aead = AESGCM(check_aead_key(key))
        self._resource_id = resource_id
        self._decoded_nbytes = decoded_nbytes
        self._prefix = nonce_prefix
        self._chunk_nbytes = chunk_nbytes
        self._count = aead_chunk_count(decoded_nbytes, chunk_nbytes)
        self._index = 0
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _next_plaintext(self) -> bytes:
        start = self._index * self._chunk_nbytes
        plain_nbytes = min(self._chunk_nbytes, self._decoded_nbytes - start)
        sealed = self._source.read_at(start + self._index * TAG_NBYTES, plain_nbytes + TAG_NBYTES)
        is_final = self._index == self._count - 1
        try:
            plain = self._aead.decrypt(
                _nonce(self._prefix, self._index),
                sealed,
                _aad(self._resource_id, self._index, is_final),
            )
        except InvalidTag:
            raise ChunkAuthenticationError(
                f"resource {self._resource_id!r}: chunk {self._index} fails authentication (the AES key is "
                "not the one the core was sealed with, or its stored bytes were altered)"
            ) from None
        self._index += 1
        return plain

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        while not self._buffer and self._index < self._count:
            self._buffer = memoryview(self._next_plaintext())
        count = min(len(view), len(self._buffer))
        view[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()


def load_aead_key(path) -> bytes:
    """An AES-256 key file: 64 hexadecimal digits (surrounding whitespace allowed)."""
    try:
        text = open(path, "rb").read().decode("ascii").strip()
        key = bytes.fromhex(text)
    except OSError as error:
        raise KeyFileError(f"cannot read AES key {path}: {error.strerror}") from None
    except (UnicodeDecodeError, ValueError):
        raise KeyFileError(f"{path}: an AES key file holds 64 hexadecimal digits") from None
    return check_aead_key(key)
