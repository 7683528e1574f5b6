"""Typed errors of core carriers.

Each class names exactly one failed check, so tests and callers can tell a flipped chunk from a
truncated frame or a wrong namespace without reading message text. The family (from
`helios.errors`) decides the exit code and HTTP status:

- `CoreError`: the file is not a core this runtime can read (layout, format, malformed protobuf).
- `IntegrityError`: stored bytes disagree with what the signed payload commits to.
- `SignatureError`: no valid signature from a trusted key covers the payload.
- `AuthorizationError`: the acceptance string or key scope does not admit the publisher namespace.
"""

from __future__ import annotations

from helios.errors import AuthorizationError, CoreError, IntegrityError, SignatureError

# --- the file is not a readable core ---------------------------------------------------------


class NotACoreError(CoreError):
    """The file does not start with the core magic bytes."""


class UnknownFormatError(CoreError):
    """A container, payload-format or protected-index version this runtime does not read."""


class ContainerError(CoreError):
    """The fixed header or body placement is inconsistent with the file (bounds, flags, size)."""


class MalformedCoreError(CoreError):
    """A protobuf message of the core does not parse, is not canonical, or breaks a format rule."""


class MissingAeadKeyError(CoreError):
    """A v4 logical-resource core was read without the operator's AES key."""


class KeyFileError(CoreError):
    """A private or public key file cannot be read or has the wrong form."""


class UnknownResourceError(CoreError):
    """A resource id that the core does not contain."""


# --- stored bytes disagree with the signed commitments ----------------------------------------


class LocationError(IntegrityError):
    """The unsigned location set does not place every resource exactly once inside its file."""


class ChunkDigestError(IntegrityError):
    """A 4 MiB chunk of a stored frame does not match its signed SHA-256."""


class ChunkAuthenticationError(IntegrityError):
    """An AES-GCM chunk failed authentication (wrong key, flipped, reordered or swapped chunk)."""


class FrameError(IntegrityError):
    """A stored resource is not exactly one well-formed zstd frame."""


class TruncatedFrameError(FrameError):
    """The stored bytes end before the zstd frame does."""


class ExtraFrameError(FrameError):
    """Another zstd frame follows the resource's one frame."""


class SkippableFrameError(FrameError):
    """A zstd skippable frame appears where the resource's frame must be."""


class TrailingBytesError(FrameError):
    """Bytes that are not a frame follow the resource's frame."""


class WindowTooLargeError(FrameError):
    """The frame header asks for a decoder window above the 8 MiB cap."""


class DecodedLengthError(IntegrityError):
    """The frame decodes to a length different from the signed decoded length."""


class DecodedSizeError(MalformedCoreError):
    """A signed decoded length that no frame of the stored length can produce (checked before
    anything is allocated for it)."""


class ResourceTooLargeError(CoreError):
    """A resource to be read whole decodes to more bytes than this machine has memory available."""


# --- signatures and trust ----------------------------------------------------------------------


class BadSignatureError(SignatureError):
    """A signature in the envelope does not verify over the payload (or its key id is wrong)."""


class UnsignedCoreError(SignatureError):
    """The envelope carries no signature at all."""


class UntrustedSignerError(SignatureError):
    """Every signature is valid, but none is from a trusted key."""


class NamespaceMismatchError(AuthorizationError):
    """The acceptance string is not exactly the signed publisher namespace."""


class KeyScopeError(AuthorizationError):
    """A trusted key signed, but it is trusted only for other namespaces."""
