"""The v4 AES-GCM chunk reader: every chunk authenticated, order and completeness bound."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios.core.aead import (
    TAG_NBYTES,
    AeadChunkReader,
    aead_chunk_count,
    aead_stored_nbytes,
    load_aead_key,
    write_aead_resource,
)
from helios.core.chunks import RangeFile
from helios.core.errors import ChunkAuthenticationError, DecodedLengthError, KeyFileError

from .builders import AES_KEY, random_bytes

PREFIX = b"\x01" * 8


def seal(data: bytes, chunk: int, resource_id: str = "r", key: bytes = AES_KEY) -> bytes:
    sink = io.BytesIO()
    stored = write_aead_resource(
        io.BytesIO(data), sink, key=key, resource_id=resource_id, nonce_prefix=PREFIX,
        chunk_nbytes=chunk,
    )
    assert stored.stored_nbytes == aead_stored_nbytes(len(data), chunk) == len(sink.getvalue())
    return sink.getvalue()


def open_sealed(tmp_path, sealed: bytes, decoded: int, chunk: int, *, resource_id="r",
                key=AES_KEY) -> io.BufferedReader:
    path = tmp_path / "sealed.bin"
    path.write_bytes(sealed)
    reader = AeadChunkReader(
        RangeFile.open(path, 0, len(sealed)), key=key, resource_id=resource_id,
        decoded_nbytes=decoded, nonce_prefix=PREFIX, chunk_nbytes=chunk,
    )
    return io.BufferedReader(reader)


@settings(max_examples=40, deadline=None)
@given(chunk=st.integers(1, 5000), data=st.data())
def test_round_trip_for_any_size_and_chunking(tmp_path_factory, chunk, data):
    size = data.draw(st.one_of(
        st.just(0), st.integers(1, 3) .map(lambda k: k * chunk), st.integers(0, 200 * chunk)
    ))
    plain = random_bytes(size, chunk)
    sealed = seal(plain, chunk)
    assert len(sealed) == size + TAG_NBYTES * aead_chunk_count(size, chunk)
    with open_sealed(tmp_path_factory.mktemp("a"), sealed, size, chunk) as stream:
        assert stream.read() == plain


def chunks_of(sealed: bytes, chunk: int) -> list[bytes]:
    step = chunk + TAG_NBYTES
    return [sealed[i : i + step] for i in range(0, len(sealed), step)]


def test_reordered_chunks_fail(tmp_path):
    sealed = seal(random_bytes(4000), 1000)
    parts = chunks_of(sealed, 1000)
    parts[1], parts[2] = parts[2], parts[1]
    with open_sealed(tmp_path, b"".join(parts), 4000, 1000) as stream:
        with pytest.raises(ChunkAuthenticationError):
            stream.read()


def test_dropped_final_chunk_fails_even_with_a_matching_length(tmp_path):
    sealed = seal(random_bytes(3000), 1000)
    with open_sealed(tmp_path, sealed[: 2 * (1000 + TAG_NBYTES)], 2000, 1000) as stream:
        with pytest.raises(ChunkAuthenticationError):
            stream.read()


def test_chunk_from_another_resource_fails(tmp_path):
    mine, theirs = seal(random_bytes(2000, 1), 1000, "a"), seal(random_bytes(2000, 2), 1000, "b")
    mixed = chunks_of(mine, 1000)[0] + chunks_of(theirs, 1000)[1]
    with open_sealed(tmp_path, mixed, 2000, 1000, resource_id="a") as stream:
        with pytest.raises(ChunkAuthenticationError):
            stream.read()


def test_wrong_key_and_every_flipped_byte_fail(tmp_path):
    plain = random_bytes(300)
    sealed = seal(plain, 100)
    with open_sealed(tmp_path, sealed, 300, 100, key=bytes(32)) as stream:
        with pytest.raises(ChunkAuthenticationError):
            stream.read()
    for position in range(len(sealed)):
        flipped = bytearray(sealed)
        flipped[position] ^= 1 << (position % 8)
        released = bytearray()
        with open_sealed(tmp_path, bytes(flipped), 300, 100) as stream:
            with pytest.raises(ChunkAuthenticationError):
                while piece := stream.read(7):
                    released += piece
        assert plain.startswith(bytes(released))
        assert len(released) <= position // (100 + TAG_NBYTES) * 100


def test_stored_length_must_fit_the_plaintext_length(tmp_path):
    sealed = seal(random_bytes(300), 100)
    with pytest.raises(DecodedLengthError):
        open_sealed(tmp_path, sealed + b"x", 300, 100)


def test_key_files(tmp_path):
    good = tmp_path / "aes.key"
    good.write_text(AES_KEY.hex() + "\n")
    assert load_aead_key(good) == AES_KEY
    for text in ["zz" * 32, "00" * 31, ""]:
        bad = tmp_path / "bad.key"
        bad.write_text(text)
        with pytest.raises(KeyFileError):
            load_aead_key(bad)
    with pytest.raises(KeyFileError):
        load_aead_key(tmp_path / "missing.key")


def test_a_wrong_key_is_named_as_a_possible_cause(tmp_path):
    sealed = seal(random_bytes(3000), 1000)
    with open_sealed(tmp_path, sealed, 3000, 1000, key=bytes(reversed(AES_KEY))) as stream:
        with pytest.raises(ChunkAuthenticationError, match=r"chunk 0 fails authentication \(the AES key is not"):
            stream.read()
