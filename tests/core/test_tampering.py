"""The tampering suite: every region flipped, truncated, extended or swapped fails with its typed
error. Never success, never another exception."""

from __future__ import annotations

import os
import shutil

import pytest

from helios.contract import core_pb2
from helios.core.errors import (
    BadSignatureError,
    ChunkAuthenticationError,
    ChunkDigestError,
    ContainerError,
    DecodedLengthError,
    ExtraFrameError,
    FrameError,
    LocationError,
    MalformedCoreError,
    NamespaceMismatchError,
    NotACoreError,
    SkippableFrameError,
    TrailingBytesError,
    TruncatedFrameError,
    UnknownFormatError,
    UnsignedCoreError,
    UntrustedSignerError,
    WindowTooLargeError,
)
from helios.core.reader import load_unverified, open_core
from helios.core.records import CoreFormat

from .builders import (
    AES_KEY,
    NAMESPACE,
    build_core,
    craft_core,
    random_bytes,
    raw_block_frame,
    read_body,
    write_body,
    zstd_frame,
)
from .tamper import body_regions, expect_rejected, flipped, sample_positions, verify

MULTI = random_bytes(8 * 1024 * 1024 + 300_000, 7)  # three 4 MiB chunks once stored
EXPECTED = {
    "header.magic": (NotACoreError,),
    "header.version": (UnknownFormatError,),
    "header.flags": (UnknownFormatError,),
    "header.placement": (ContainerError,),
    "envelope.payload": (BadSignatureError,),
    "envelope.signature": (BadSignatureError, MalformedCoreError, UnsignedCoreError),
    "location": (LocationError, MalformedCoreError),
    "body.framing": (MalformedCoreError, UnknownFormatError, BadSignatureError, UnsignedCoreError),
}


def expected_for(region_name: str) -> tuple[type, ...]:
    return EXPECTED[region_name.split("[")[0]]


@pytest.fixture(scope="module", params=list(CoreFormat), ids=lambda f: f.name)
def base(request, tmp_path_factory, key, other_key):
    """A core signed by `key` (trusted) and `other_key` (untrusted but valid)."""
    path = tmp_path_factory.mktemp("tamper") / "t.core"
    extra = {"blob.a": random_bytes(3000, 1), "blob.b": random_bytes(3000, 2), "blob.multi": MULTI}
    build_core(path, [key, other_key], core_format=request.param, extra=extra)
    return request.param, path


def test_untampered_base_verifies(base, key):
    verify(base[1], [key.public])


def test_every_body_and_header_byte_flipped(base, key):
    core_format, path = base
    budget = 4000 if core_format is CoreFormat.PAYLOAD_V2 else 300
    problems = []
    for region in body_regions(path):
        positions = sample_positions(region.start, region.end, budget // 10 if
                                     region.name == "envelope.payload" else budget)
        for position in positions:
            mask = 1 << (position % 8)
            with flipped(path, position, mask):
                problem = expect_rejected(lambda: verify(path, [key.public]),
                                          expected_for(region.name), f"{region.name}@{position}")
            if problem:
                problems.append(problem)
    assert problems == []


def frame_expectation(core_format: CoreFormat) -> tuple[type, ...]:
    return (ChunkAuthenticationError,) if core_format.is_sealed else (ChunkDigestError,)


def test_every_frame_and_chunk_flipped(base, key):
    core_format, path = base
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public], aes_key=AES_KEY)
    placements = load_unverified(path).placements
    problems = []
    for info in core.resources:
        placement = placements[info.id]
        chunk = 4 * 1024 * 1024 + (16 if core_format.is_sealed else 0)
        positions = set(sample_positions(placement.offset, placement.offset + placement.nbytes, 64))
        for boundary in range(placement.offset, placement.offset + placement.nbytes, chunk):
            positions |= {boundary, boundary + chunk // 2, boundary + chunk - 1}
        for position in sorted(p for p in positions if p < placement.offset + placement.nbytes):
            with flipped(path, position, 0x80):
                problem = expect_rejected(lambda: core.read_resource(info.id),
                                          frame_expectation(core_format), f"{info.id}@{position}")
            if problem:
                problems.append(problem)
    assert problems == []


def copy_of(path, tmp_path, name="copy.core"):
    target = tmp_path / name
    shutil.copyfile(path, target)
    return target


def test_truncations(base, key, tmp_path):
    _, path = base
    data = path.read_bytes()
    offset, _ = read_body(path)
    cuts = [0, 1, 7, 8, 20, 31, 32, 33, offset // 2, offset - 1, offset, offset + 1,
            (offset + len(data)) // 2, len(data) - 1]
    problems = []
    for cut in cuts:
        target = tmp_path / "cut.core"
        target.write_bytes(data[:cut])
        allowed = (NotACoreError,) if cut < 8 else (ContainerError,)
        problems.append(expect_rejected(lambda: verify(target, [key.public]), allowed, f"cut@{cut}"))
    assert [p for p in problems if p] == []


def test_extensions(base, key, tmp_path):
    _, path = base
    data = path.read_bytes()
    offset, _ = read_body(path)
    variants = {
        "append-byte": data + b"\x00",
        "append-frame": data + zstd_frame(b"extra"),
        "append-core": data + data[:64],
        "insert-after-header": data[:32] + b"\x00" + data[32:],
        "insert-in-frames": data[: offset // 2] + b"xx" + data[offset // 2 :],
        "insert-before-body": data[:offset] + b"\x00" + data[offset:],
    }
    problems = []
    for name, content in variants.items():
        target = tmp_path / "ext.core"
        target.write_bytes(content)
        problems.append(expect_rejected(lambda: verify(target, [key.public]), (ContainerError,), name))
    assert [p for p in problems if p] == []


def rewrite(path, tmp_path, mutate):
    """A copy of `path` whose CoreBody was changed by `mutate` (header fixed to match)."""
    target = copy_of(path, tmp_path)
    _, body = read_body(target)
    mutate(body)
    write_body(target, body)
    return target


def test_crafted_body_extensions_and_truncations(base, key, tmp_path):
    """Parts of the body lengthened or shortened with the protobuf framing kept consistent."""
    _, path = base

    def extra_signature(body):
        body.envelope.signatures.add(algorithm=1, key_id=b"\xff" * 16, public_key=b"\x00" * 32,
                                     signature=b"\x00" * 64)

    def longer_payload(body):
        body.envelope.payload += b"\x00"

    def shorter_payload(body):
        body.envelope.payload = body.envelope.payload[:-1]

    def shorter_signature(body):
        body.envelope.signatures[0].signature = body.envelope.signatures[0].signature[:-1]

    def shorter_public_key(body):
        body.envelope.signatures[0].public_key = body.envelope.signatures[0].public_key[:-1]

    def no_signatures(body):
        del body.envelope.signatures[:]

    def extra_location(body):
        body.locations.locations.add(resource_id="ghost", offset=0)

    def dropped_location(body):
        del body.locations.locations[-1]

    def unknown_field(body):
        body.locations.locations[0].MergeFromString(b"\xa0\x06\x01")

    def future_format(body):
        body.format_version = 3

    cases = [(extra_signature, BadSignatureError), (longer_payload, BadSignatureError),
             (shorter_payload, BadSignatureError), (shorter_signature, BadSignatureError),
             (shorter_public_key, BadSignatureError), (no_signatures, UnsignedCoreError),
             (extra_location, LocationError), (dropped_location, LocationError),
             (unknown_field, MalformedCoreError), (future_format, UnknownFormatError)]
    problems = [expect_rejected(lambda: verify(rewrite(path, tmp_path, m), [key.public]), (e,),
                                m.__name__) for m, e in cases]
    assert [p for p in problems if p] == []


def test_frame_extended_inside_a_consistent_file(base, key, tmp_path):
    """Bytes inserted after a frame, with every later location and the header shifted."""
    _, path = base
    target = copy_of(path, tmp_path)
    data = target.read_bytes()
    offset, body = read_body(target)
    victim = min(body.locations.locations, key=lambda loc: loc.offset)
    end = victim.offset + load_unverified(path).placements[victim.resource_id].nbytes
    for location in body.locations.locations:
        if location.offset >= end:
            location.offset += 5
    target.write_bytes(data[:end] + b"extra" + data[end:offset] + data[offset:])
    # the body moved by 5 bytes: rewrite header and body consistently
    from helios.core.layout import HEADER

    encoded = body.SerializeToString(deterministic=True)
    raw = target.read_bytes()
    target.write_bytes(HEADER.pack(raw[:8], 1, 0, offset + 5, len(encoded)) + raw[32 : offset + 5]
                       + encoded)
    problem = expect_rejected(lambda: verify(target, [key.public]), (LocationError,), "extended")
    assert problem is None


def test_swaps(base, key, tmp_path):
    core_format, path = base
    placements = load_unverified(path).placements
    a, b = placements["blob.a"], placements["blob.b"]
    assert a.nbytes == b.nbytes
    data = bytearray(path.read_bytes())
    swapped = bytearray(data)
    swapped[a.offset : a.offset + a.nbytes] = data[b.offset : b.offset + b.nbytes]
    swapped[b.offset : b.offset + b.nbytes] = data[a.offset : a.offset + a.nbytes]
    frames = tmp_path / "frames.core"
    frames.write_bytes(swapped)

    def swap_locations(body):
        by_id = {loc.resource_id: loc for loc in body.locations.locations}
        by_id["blob.a"].offset, by_id["blob.b"].offset = by_id["blob.b"].offset, by_id["blob.a"].offset

    def swap_signature_bytes(body):
        first, second = body.envelope.signatures
        first.signature, second.signature = second.signature, first.signature

    def swap_signature_order(body):
        entries = list(body.envelope.signatures)[::-1]
        del body.envelope.signatures[:]
        body.envelope.signatures.extend(entries)

    multi = placements["blob.multi"]
    step = 4 * 1024 * 1024 + (16 if core_format.is_sealed else 0)
    chunks = bytearray(data)
    first = multi.offset
    chunks[first : first + step], chunks[first + step : first + 2 * step] = (
        data[first + step : first + 2 * step], data[first : first + step])
    reordered = tmp_path / "chunks.core"
    reordered.write_bytes(chunks)
    frame_error = frame_expectation(core_format)
    cases = {
        "frames": (lambda: verify(frames, [key.public]), frame_error),
        "locations": (lambda: verify(rewrite(path, tmp_path, swap_locations), [key.public]),
                      frame_error),
        "signature-bytes": (lambda: verify(rewrite(path, tmp_path, swap_signature_bytes),
                                           [key.public]), (BadSignatureError,)),
        "signature-order": (lambda: verify(rewrite(path, tmp_path, swap_signature_order),
                                           [key.public]), (BadSignatureError,)),
        "chunks": (lambda: verify(reordered, [key.public]), frame_error),
    }
    problems = [expect_rejected(check, allowed, name) for name, (check, allowed) in cases.items()]
    assert [p for p in problems if p] == []


def test_wrong_key_and_wrong_namespace(base, key, tmp_path):
    from helios.core.keys import SigningKey

    _, path = base
    with pytest.raises(UntrustedSignerError):
        verify(path, [SigningKey.generate().public])
    with pytest.raises(NamespaceMismatchError):
        verify(path, [key.public], accept="test.helios/other")


def test_replayed_old_signature_and_envelope(key, tmp_path):
    old, new = tmp_path / "old.core", tmp_path / "new.core"
    build_core(old, [key], extra={"blob": random_bytes(4000, 1)})
    build_core(new, [key], extra={"blob": random_bytes(4000, 2)})
    _, old_body = read_body(old)

    def old_signature(body):
        body.envelope.signatures[0].signature = old_body.envelope.signatures[0].signature

    def old_envelope(body):
        body.envelope.CopyFrom(old_body.envelope)

    with pytest.raises(BadSignatureError):
        verify(rewrite(new, tmp_path, old_signature), [key.public])
    with pytest.raises(ChunkDigestError):
        verify(rewrite(new, tmp_path, old_envelope), [key.public])


def test_split_core_parts_tampered(key, tmp_path):
    path = tmp_path / "s.core"
    files = build_core(path, [key], extra={"blob.a": random_bytes(3000, 1),
                                           "blob.b": random_bytes(3000, 2)}, split_nbytes=1).files
    placements = load_unverified(path).placements
    part_a = tmp_path / placements["blob.a"].file
    part_b = tmp_path / placements["blob.b"].file
    original_a, original_b = part_a.read_bytes(), part_b.read_bytes()
    cases = [
        (lambda: part_a.write_bytes(original_a[:-1]), LocationError),
        (lambda: part_a.write_bytes(original_a + b"\x00"), LocationError),
        (lambda: part_a.unlink(), LocationError),
        (lambda: part_a.write_bytes(original_a[:100] + bytes([original_a[100] ^ 1])
                                    + original_a[101:]), ChunkDigestError),
        (lambda: (part_a.write_bytes(original_b), part_b.write_bytes(original_a)), ChunkDigestError),
    ]
    problems = []
    for index, (tamper, error) in enumerate(cases):
        tamper()
        problems.append(expect_rejected(lambda: verify(path, [key.public]), (error,), f"part{index}"))
        part_a.write_bytes(original_a)
        part_b.write_bytes(original_b)
    assert [p for p in problems if p] == []
    assert len(files) > 2
    verify(path, [key.public])


def test_hostile_frames_signed_by_a_trusted_key(key, tmp_path):
    """Frames a writer never produces, honestly digested and signed: the frame checks catch them."""
    hello = zstd_frame(b"hello world")
    bomb = zstd_frame(bytes(64 << 20), with_size=False)
    two_gib_window = raw_block_frame(b"hello", window_exponent=21)
    skippable = (0x184D2A50).to_bytes(4, "little") + (0).to_bytes(4, "little")
    cases = {
        "bomb": ((bomb, 1024), DecodedLengthError),
        "window-2gib": ((two_gib_window, 5), WindowTooLargeError),
        "trailing-garbage": ((hello + b"garbage!", 11), TrailingBytesError),
        "extra-frame": ((hello + hello, 11), ExtraFrameError),
        "skippable-first": ((skippable + hello, 11), SkippableFrameError),
        "skippable-after": ((hello + skippable, 11), SkippableFrameError),
        "truncated": ((hello[:-3], 11), TruncatedFrameError),
        "longer-than-signed": ((zstd_frame(b"hello world", with_size=False), 10), DecodedLengthError),
        "shorter-than-signed": ((zstd_frame(b"hello world", with_size=False), 12), DecodedLengthError),
        "declared-size-mismatch": ((hello, 12), DecodedLengthError),
        "not-a-frame": ((b"\x00" * 32, 32), FrameError),
    }
    problems = []
    for name, ((stored, decoded), error) in cases.items():
        path = craft_core(tmp_path / f"{name}.core", [key], {"hostile": (stored, decoded)})
        core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
        problems.append(expect_rejected(lambda: core.read_resource("hostile"), (error,), name))
    assert [p for p in problems if p] == []


def test_body_not_canonical(small_core, key, tmp_path):
    target = copy_of(small_core, tmp_path)
    offset, body = read_body(target)
    raw = target.read_bytes()
    # the same CoreBody with format_version encoded as a padded (non-minimal) varint
    encoded = body.SerializeToString(deterministic=True)
    assert encoded.startswith(b"\x08\x02")
    padded = b"\x08\x82\x00" + encoded[2:]
    from helios.core.layout import HEADER

    target.write_bytes(HEADER.pack(raw[:8], 1, 0, offset, len(padded)) + raw[32:offset] + padded)
    assert core_pb2.CoreBody.FromString(padded) == body
    with pytest.raises(MalformedCoreError):
        verify(target, [key.public])


def test_deleted_core_file(tmp_path, key):
    with pytest.raises(ContainerError):
        verify(tmp_path / "missing.core", [key.public])
    (tmp_path / "dir.core").mkdir()
    with pytest.raises(ContainerError):
        verify(tmp_path / "dir.core", [key.public])
    os.close(os.open(tmp_path / "empty.core", os.O_CREAT | os.O_WRONLY))
    with pytest.raises(NotACoreError):
        verify(tmp_path / "empty.core", [key.public])
