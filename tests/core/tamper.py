"""Tampering harness: the regions of a core file and an in-place byte flipper.

A check is "verification": open_core with the test's trust settings, then reading every resource
(what `helios verify` does). `expect_rejected` runs a check and returns a problem string when the
check succeeded or raised anything other than the allowed typed errors.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helios.core.layout import HEADER_NBYTES
from helios.core.reader import open_core

from .builders import AES_KEY, NAMESPACE, find_region, read_body


@dataclass(frozen=True)
class Region:
    name: str
    start: int
    end: int


def body_regions(path: Path) -> list[Region]:
    """Header fields, each envelope part, each location, and the body's protobuf framing."""
    data = path.read_bytes()
    offset, body = read_body(path)
    regions = [
        Region("header.magic", 0, 8),
        Region("header.version", 8, 12),
        Region("header.flags", 12, 16),
        Region("header.placement", 16, HEADER_NBYTES),
    ]
    start, end = find_region(data, body.envelope.payload, offset)
    regions.append(Region("envelope.payload", start, end))
    for index, signature in enumerate(body.envelope.signatures):
        start, end = find_region(data, signature.SerializeToString(deterministic=True), offset)
        regions.append(Region(f"envelope.signature[{index}]", start, end))
    for location in body.locations.locations:
        start, end = find_region(data, location.SerializeToString(deterministic=True), offset)
        regions.append(Region(f"location[{location.resource_id}]", start, end))
    covered = sorted((r.start, r.end) for r in regions if r.start >= offset)
    position = offset
    for start, end in covered:
        if start > position:
            regions.append(Region("body.framing", position, start))
        position = max(position, end)
    if position < len(data):
        regions.append(Region("body.framing", position, len(data)))
    return regions


@contextlib.contextmanager
def flipped(path: Path, position: int, mask: int):
    """XORs one byte of `path` with `mask` for the duration of the block (in place)."""
    fd = os.open(path, os.O_RDWR)
    try:
        original = os.pread(fd, 1, position)
        os.pwrite(fd, bytes([original[0] ^ mask]), position)
        yield
    finally:
        os.pwrite(fd, original, position)
        os.close(fd)


def verify(path: Path, trusted, accept: str = NAMESPACE) -> None:
    core = open_core(path, accept=accept, trusted_keys=trusted, aes_key=AES_KEY)
    core.verify_resources()


def expect_rejected(check: Callable[[], object], allowed: tuple[type, ...], what: str) -> str | None:
    try:
        check()
    except allowed:
        return None
    except Exception as error:  # noqa: BLE001 - any other exception is the failure being tested
        return f"{what}: raised {type(error).__name__}: {error}"
    return f"{what}: tampered core was accepted"


def sample_positions(start: int, end: int, budget: int) -> list[int]:
    """Every position if the region is small, else both edges and an even spread."""
    if end - start <= budget:
        return list(range(start, end))
    step = (end - start) / (budget - 16)
    spread = {start + int(i * step) for i in range(budget - 16)}
    return sorted(spread | set(range(start, start + 8)) | set(range(end - 8, end)))
