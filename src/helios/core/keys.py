"""Ed25519 signing keys, public key files and the trusted key set.

Files:
- private key `KEY`: PKCS#8 PEM, unencrypted, created with mode 0600 (never overwritten).
- public key `KEY.pub`: one line `helios-ed25519 BASE64 [NAMESPACE ...]`; lines whose first
  nonblank character is `#` are comments, and blank lines are ignored. UTF-8 (a publisher
  namespace may be non-ASCII).
  Listed namespaces scope the key: it is trusted only for those publisher namespaces. A key file
  without namespaces is trusted for whichever namespace the operator accepts alongside it.

A key id is the first 16 bytes of SHA-256 over a domain tag and the raw 32-byte public key. All
objects here are immutable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from helios.core.errors import KeyFileError

PUBLIC_KEY_TAG = "helios-ed25519"
KEY_ID_NBYTES = 16
_KEY_ID_DOMAIN = b"helios.ed25519.key-id\x00"


def key_id_of(public_raw: bytes) -> bytes:
    """Key id of a raw Ed25519 public key."""
    return hashlib.sha256(_KEY_ID_DOMAIN + public_raw).digest()[:KEY_ID_NBYTES]


def check_namespace(namespace: str) -> str:
    """Returns `namespace` if it is a valid publisher namespace, else raises ValueError."""
    if not namespace or len(namespace.encode()) > 256:
        raise ValueError("a publisher namespace is 1 to 256 bytes")
    if any(ch.isspace() or not ch.isprintable() for ch in namespace):
        raise ValueError(f"publisher namespace {namespace!r} contains whitespace or control chars")
    return namespace


@dataclass(frozen=True)
class PublicKey:
    """A raw Ed25519 public key and the namespaces it is trusted for (empty: any accepted one)."""

    raw: bytes
    namespaces: frozenset[str] = frozenset()

    @property
    def key_id(self) -> bytes:
        return key_id_of(self.raw)

    def admits(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def to_line(self) -> str:
        words = [PUBLIC_KEY_TAG, base64.b64encode(self.raw).decode(), *sorted(self.namespaces)]
        return " ".join(words) + "\n"


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key. `sign` is deterministic (Ed25519 needs no randomness)."""

    private: Ed25519PrivateKey

    @property
    def public(self) -> PublicKey:
        raw = self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return PublicKey(raw)

    @property
    def key_id(self) -> bytes:
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    def to_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def generate(cls) -> "SigningKey":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> "SigningKey":
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except UnsupportedAlgorithm as error:  # a key of a type or curve this build cannot load (secp112r1)
            raise KeyFileError(f"the private key is not an Ed25519 key: {error}") from None
        except (ValueError, TypeError) as error:
            raise KeyFileError(f"not an unencrypted PEM private key: {error}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError("the private key is not an Ed25519 key")
        return cls(key)


def write_key_pair(path: Path, key: SigningKey, namespaces: Iterable[str] = ()) -> Path:
    """Writes `path` (private, mode 0600) and `path.pub`; refuses to overwrite either.

    Returns the public key path.
    """
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    public = PublicKey(key.public.raw, frozenset(check_namespace(ns) for ns in namespaces))
    pub_text = f"# Helios Ed25519 public key, key id {public.key_id.hex()}\n" + public.to_line()
    for target in (path, pub_path):
        if os.path.lexists(target):  # a dangling link too: the exclusive create below would fail on it
            raise KeyFileError(f"{target} exists; refusing to overwrite a key")
    # Both files are created exclusively, and a failure on the way (a file that appeared meanwhile,
    # a full disk) removes what was created: never a private key without its .pub, or a partial one.
    created: list[Path] = []
    try:
        for target, data, mode in ((path, key.to_pem(), 0o600), (pub_path, pub_text.encode("utf-8"), 0o666)):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            created.append(target)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
    except BaseException as error:
        for target in created:
            target.unlink(missing_ok=True)
        if isinstance(error, FileExistsError):
            raise KeyFileError(f"{error.filename} exists; refusing to overwrite a key") from None
        raise
    return pub_path


def load_signing_key(path: Path) -> SigningKey:
    try:
        pem = Path(path).read_bytes()
    except OSError as error:
        raise KeyFileError(f"cannot read private key {path}: {error.strerror}") from None
    return SigningKey.from_pem(pem)


def parse_public_key(text: str, origin: str = "public key") -> PublicKey:
    """Parses the one-line public key format (see module docstring)."""
    lines = [ln.strip() for ln in text.splitlines()]  # CRLF line ends, indentation, blank lines
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if len(lines) != 1:
        raise KeyFileError(f"{origin}: expected exactly one key line")
    words = lines[0].split()
    if len(words) < 2 or words[0] != PUBLIC_KEY_TAG:
        raise KeyFileError(f"{origin}: not a '{PUBLIC_KEY_TAG}' key line")
    try:
        raw = base64.b64decode(words[1], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise KeyFileError(f"{origin}: the key is not 32 base64-encoded bytes")
    try:
        namespaces = frozenset(check_namespace(ns) for ns in words[2:])
    except ValueError as error:
        raise KeyFileError(f"{origin}: {error}") from None
    return PublicKey(raw, namespaces)


def load_public_key(path: Path) -> PublicKey:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a namespace or a comment may be non-ASCII
    except (OSError, UnicodeDecodeError) as error:
        raise KeyFileError(f"cannot read public key {path}: {error}") from None
    return parse_public_key(text, str(path))


@dataclass(frozen=True)
class TrustedKeys:
    """The operator's trusted public keys by key id. Immutable; build with `from_paths`."""

    by_id: Mapping[bytes, PublicKey]

    def get(self, key_id: bytes) -> PublicKey | None:
        return self.by_id.get(key_id)

    def __len__(self) -> int:
        return len(self.by_id)

    @classmethod
    def of(cls, keys: Iterable[PublicKey]) -> "TrustedKeys":
        """Merges keys with equal ids: unscoped wins, otherwise namespaces are united."""
        merged: dict[bytes, PublicKey] = {}
        for key in keys:
            old = merged.get(key.key_id)
            if old is not None and old.namespaces and key.namespaces:
                key = PublicKey(key.raw, old.namespaces | key.namespaces)
            elif old is not None:
                key = PublicKey(key.raw)
            merged[key.key_id] = key
        return cls(dict(merged))

    @classmethod
    def from_paths(cls, paths: Iterable[Path], load: Callable[[Path], PublicKey] | None = None) -> "TrustedKeys":
        """Loads `.pub` files (each through `load`, default `load_public_key`); a directory
        contributes every `*.pub` file directly inside it."""
        load = load or load_public_key
        keys: list[PublicKey] = []
        for path in map(Path, paths):
            if path.is_dir():
                files = sorted(path.glob("*.pub"))
                if not files:
                    raise KeyFileError(f"{path} holds no *.pub key files")
                keys.extend(load(f) for f in files)
            else:
                keys.append(load(path))
        return cls.of(keys)
