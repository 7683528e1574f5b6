"""Property tests over resource sizes with the real 4 MiB chunks: empty resources, stored lengths
that are exact chunk multiples, and resources spanning many chunks, in every carrier."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.core.chunks import CHUNK_NBYTES, chunk_count
from helios.core.reader import load_unverified, open_core
from helios.core.records import CoreFormat

from .builders import AES_KEY, NAMESPACE, build_core, craft_core, random_bytes, raw_frame_of_stored_size

MiB = 1024 * 1024
SIZES = st.one_of(
    st.sampled_from([0, 1, CHUNK_NBYTES - 1, CHUNK_NBYTES, CHUNK_NBYTES + 1, 2 * CHUNK_NBYTES]),
    st.integers(0, 9 * MiB),
)


def content(size: int, seed: int, compressible: bool) -> bytes:
    if compressible:
        return (random_bytes(min(size, 4096), seed) * (size // 4096 + 1))[:size]
    return random_bytes(size, seed)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=SIZES,
    seed=st.integers(0, 3),
    compressible=st.booleans(),
    core_format=st.sampled_from(list(CoreFormat)),
)
def test_any_size_round_trips_in_every_carrier(tmp_path_factory, key, size, seed, compressible,
                                               core_format):
    data = content(size, seed, compressible)
    path = tmp_path_factory.mktemp("p") / "p.core"
    build_core(path, [key], core_format=core_format, extra={"blob": data})
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public], aes_key=AES_KEY)
    info = core.resource("blob")
    assert info.decoded_nbytes == size
    if not core_format.is_sealed:
        entry = load_unverified(path).entry("blob")
        assert len(entry.chunk_sha256) == chunk_count(info.stored_nbytes) >= 1
    with core.open_resource("blob") as stream:
        assert b"".join(iter(lambda: stream.read(3 * MiB + 7), b"")) == data


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_stored_length_an_exact_multiple_of_4_mib(tmp_path, key, chunks):
    frame, data = raw_frame_of_stored_size(chunks * CHUNK_NBYTES, seed=chunks)
    path = craft_core(tmp_path / "m.core", [key], {"blob": (frame, len(data))})
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    assert core.resource("blob").stored_nbytes == chunks * CHUNK_NBYTES
    assert len(load_unverified(path).entry("blob").chunk_sha256) == chunks
    assert core.read_resource("blob") == data
