"""Immutable records at the core boundary: formats, resource kinds, publisher terms, resources.

Payload cores (format 2) and logical-resource cores (format 1, index v6 or v4) differ on disk but
describe resources the same way once read; `ResourceEntry` is that common, signed description.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from helios.contract import core_pb2

FORMAT_LOGICAL_RESOURCE = 1
FORMAT_PAYLOAD = 2
INDEX_AEAD = 4
INDEX_FRAMES = 6


class CoreFormat(enum.Enum):
    """The three carriers a reader understands, as (payload format, protected index version)."""

    PAYLOAD_V2 = (FORMAT_PAYLOAD, None)
    LOGICAL_V6 = (FORMAT_LOGICAL_RESOURCE, INDEX_FRAMES)
    LOGICAL_V4 = (FORMAT_LOGICAL_RESOURCE, INDEX_AEAD)

    @property
    def format_version(self) -> int:
        return self.value[0]

    @property
    def index_version(self) -> int | None:
        return self.value[1]

    @property
    def is_sealed(self) -> bool:
        """True when resources are AES-GCM sealed chunks rather than zstd frames."""
        return self is CoreFormat.LOGICAL_V4


class ResourceKind(enum.IntEnum):
    """Mirror of `helios.contract.ResourceKind` (numbers equal; a test keeps them equal)."""

    PROGRAM = core_pb2.RESOURCE_KIND_PROGRAM
    WEIGHTS = core_pb2.RESOURCE_KIND_WEIGHTS
    TOKENIZER = core_pb2.RESOURCE_KIND_TOKENIZER
    CHAT_TEMPLATE = core_pb2.RESOURCE_KIND_CHAT_TEMPLATE
    TUNING_PROGRAM = core_pb2.RESOURCE_KIND_TUNING_PROGRAM
    PROGRAM_IMAGE = core_pb2.RESOURCE_KIND_PROGRAM_IMAGE

    @property
    def is_program(self) -> bool:
        """A captured program in either storage: PROGRAM_IMAGE (data) or the pickled PROGRAM/TUNING_PROGRAM."""
        return self in (ResourceKind.PROGRAM, ResourceKind.TUNING_PROGRAM, ResourceKind.PROGRAM_IMAGE)


@dataclass(frozen=True)
class Publisher:
    """Signed publisher namespace and terms."""

    namespace: str
    license: str = ""
    acceptance_terms: str = ""


@dataclass(frozen=True)
class ResourceInfo:
    """What a caller may know about a stored resource. `rank` None: shared by every rank."""

    id: str
    kind: ResourceKind
    rank: int | None
    stored_nbytes: int
    decoded_nbytes: int


@dataclass(frozen=True)
class ResourceEntry:
    """The signed commitments for one stored resource, independent of the carrier format.

    `chunk_sha256` is set for zstd-frame resources, `nonce_prefix` for AES-GCM ones.
    """

    info: ResourceInfo
    chunk_nbytes: int
    chunk_sha256: tuple[bytes, ...] = ()
    nonce_prefix: bytes = b""

    @property
    def id(self) -> str:
        return self.info.id


@dataclass(frozen=True)
class Placement:
    """Where a resource's stored bytes lie: `file` empty means the core file itself."""

    file: str
    offset: int
    nbytes: int
