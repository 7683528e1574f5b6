"""Resolving the unsigned LocationSet against the signed resource entries.

The LocationSet is not signed (so a core can be split or relocated without re-signing), hence it is
trusted for nothing but placement; the chunk commitments check the bytes found there. It must
place every signed resource exactly once, and the placed ranges must tile their files exactly:

- the core file: from the end of the header to the start of the body, no gap and no overlap;
- each sibling file (a plain name in the core's directory): from byte 0 to its end.

So no byte of any file is unaccounted for, and an inserted, dropped or appended byte is caught
before any stored byte is read.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from pathlib import Path
from typing import Mapping, Sequence

from helios.contract import core_pb2
from helios.core.errors import LocationError
from helios.core.layout import HEADER_NBYTES
from helios.core.records import Placement, ResourceEntry


def check_sibling_name(name: str) -> str:
    """Returns `name` if it is a plain file name usable for a sibling file, else LocationError."""
    if (
        not name
        or name in (".", "..")
        or any(sep in name for sep in ("/", "\\", "\x00"))
        or len(name.encode()) > 255
    ):
        raise LocationError(f"sibling file name {name!r} is not a plain file name")
    return name


def _placements(
    locations: core_pb2.LocationSet, entries: Sequence[ResourceEntry]
) -> dict[str, Placement]:
    sizes = {entry.id: entry.info.stored_nbytes for entry in entries}
    placed: dict[str, Placement] = {}
    for location in locations.locations:
        if location.resource_id not in sizes:
            raise LocationError(f"a location names unknown resource {location.resource_id!r}")
        if location.resource_id in placed:
            raise LocationError(f"resource {location.resource_id!r} is placed twice")
        if location.file:
            check_sibling_name(location.file)
        nbytes = sizes[location.resource_id]
        placed[location.resource_id] = Placement(location.file, location.offset, nbytes)
    missing = sorted(set(sizes) - set(placed))
    if missing:
        raise LocationError(f"resources without a location: {', '.join(map(repr, missing))}")
    return placed


def _check_tiling(name: str, ranges: list[Placement], start: int, end: int) -> None:
    position = start
    for placement in sorted(ranges, key=lambda p: p.offset):
        if placement.offset != position:
            raise LocationError(f"{name}: stored ranges leave a gap or overlap at byte {position}")
        position = placement.offset + placement.nbytes
    if position != end:
        raise LocationError(f"{name}: stored ranges do not end where the file region ends")


def resolve_locations(
    locations: core_pb2.LocationSet,
    entries: Sequence[ResourceEntry],
    core_path: Path,
    body_offset: int,
) -> Mapping[str, Placement]:
    """Resource id -> placement; raises LocationError unless the placement tiles every file."""
    placed = _placements(locations, entries)
    by_file: dict[str, list[Placement]] = defaultdict(list)
    for placement in placed.values():
        by_file[placement.file].append(placement)
    _check_tiling(core_path.name, by_file.pop("", []), HEADER_NBYTES, body_offset)
    for name, ranges in by_file.items():
        if name == core_path.name:
            raise LocationError(f"sibling file {name!r} is the core file itself")
        try:
            status = os.stat(core_path.parent / name)
        except OSError as error:
            raise LocationError(f"sibling file {name!r}: {error.strerror}") from None
        # A directory's st_size (4096 on ext4) can equal a part's length; only a file holds one.
        if not stat.S_ISREG(status.st_mode):
            raise LocationError(f"sibling file {name!r} is not a regular file")
        _check_tiling(name, ranges, 0, status.st_size)
    return placed


def placement_path(core_path: Path, placement: Placement) -> Path:
    return core_path.parent / placement.file if placement.file else core_path


def encode_locations(placed: Mapping[str, Placement]) -> core_pb2.LocationSet:
    """A LocationSet for `placed`, ordered by file then offset (a canonical order)."""
    ordered = sorted(placed.items(), key=lambda item: (item[1].file, item[1].offset))
    return core_pb2.LocationSet(
        locations=[
            core_pb2.ResourceLocation(resource_id=rid, file=p.file, offset=p.offset)
            for rid, p in ordered
        ]
    )
