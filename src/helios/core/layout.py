"""The fixed file header of a core file and how it places the CoreBody.

Layout of a core file (all integers little-endian):

    0   8  magic b"\\x89HELIOS\\n"
    8   4  container version (1)
    12  4  flags (0; any other value is rejected)
    16  8  body offset
    24  8  body length
    32  .. stored resources that the LocationSet places in this file, back to back
    ..  .. CoreBody (ends exactly at the end of the file)

The header is written last (after the resources and the body), so a partially written file never
carries a valid header.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from helios.core.errors import ContainerError, NotACoreError, UnknownFormatError

MAGIC = b"\x89HELIOS\n"
CONTAINER_VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
HEADER_NBYTES = HEADER.size
MAX_BODY_NBYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CoreHeader:
    body_offset: int
    body_nbytes: int


def encode_header(header: CoreHeader) -> bytes:
    return HEADER.pack(MAGIC, CONTAINER_VERSION, 0, header.body_offset, header.body_nbytes)


def decode_header(raw: bytes, file_nbytes: int) -> CoreHeader:
    """Checks the header against the file length; raises the specific CoreError."""
    if not raw.startswith(MAGIC):
        raise NotACoreError("not a Helios core (magic bytes missing)")
    if len(raw) < HEADER_NBYTES:
        raise ContainerError("the file ends inside the core header")
    _, version, flags, body_offset, body_nbytes = HEADER.unpack(raw[:HEADER_NBYTES])
    if version != CONTAINER_VERSION:
        raise UnknownFormatError(f"container version {version} is not readable (expected 1)")
    if flags:
        raise UnknownFormatError(f"unknown container flags {flags:#x}")
    if not 0 < body_nbytes <= MAX_BODY_NBYTES:
        raise ContainerError(f"body length {body_nbytes} is outside 1..{MAX_BODY_NBYTES}")
    if body_offset < HEADER_NBYTES or body_offset + body_nbytes != file_nbytes:
        raise ContainerError("the body must follow the header and end exactly at the end of file")
    return CoreHeader(body_offset, body_nbytes)


@dataclass(frozen=True)
class RawCore:
    """The undecoded parts of a core file: its header, body bytes and length."""

    header: CoreHeader
    body: bytes
    file_nbytes: int


def read_raw_core(path: os.PathLike | str) -> RawCore:
    """Reads the header and body of a core file (nothing of the stored resources)."""
    try:
        with open(path, "rb") as handle:
            file_nbytes = os.fstat(handle.fileno()).st_size
            header = _named(path, handle.read(HEADER_NBYTES), file_nbytes)
            handle.seek(header.body_offset)
            body = handle.read(header.body_nbytes)
    except OSError as error:
        raise ContainerError(f"cannot read {path}: {error.strerror}") from None
    if len(body) != header.body_nbytes:
        raise ContainerError(f"{path} changed while it was read")
    return RawCore(header, body, file_nbytes)


def _named(path: os.PathLike | str, raw: bytes, file_nbytes: int) -> CoreHeader:
    """`decode_header`, its error naming the file: the usual mistake is a file that is not a core
    at all (a key, a part file, a contract), and the line should say which one."""
    if not file_nbytes:
        raise NotACoreError(f"{path} is empty, not a Helios core")
    try:
        return decode_header(raw, file_nbytes)
    except (NotACoreError, ContainerError, UnknownFormatError) as error:
        raise type(error)(f"{path}: {error}") from None
