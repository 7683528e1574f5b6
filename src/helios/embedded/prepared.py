"""The core `helios serve` runs when no model is given: the project's embedded default model.

`embedded_core()` returns a signed core for the checkpoint shipped in `helios.embedded`. Until that
package ships a prepared core itself, the checkpoint is prepared on first use into the cache
directory (``$HELIOS_CACHE``, else ``~/.cache/helios``) and signed with a key generated there; the
core's directory name carries a digest of the checkpoint files, the publisher key's id and
`CORE_GENERATION`, so a changed checkpoint, a core signed by a key the cache no longer holds (its key
files removed: a new key is made), a core written in a storage this version no longer loads, or one
whose preparation declared less, is prepared again. Preparation writes into a private directory and renames it into place, so concurrent first
runs cannot see a partial core. The embedded-model owner may replace the body of `embedded_core`
(for example to return a committed core and its public key) without touching the server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from helios.errors import LoadError

NAMESPACE = "helios.embedded/default"
SERVED_ID = "helios-default"
CACHE_ENV = "HELIOS_CACHE"
KEY_NAME = "embedded-publisher.key"
# Held by the run making or repairing the cache's publisher key (`_publisher_key`).
LOCK_NAME = ".embedded-publisher.lock"
CONTEXT_TOKENS = 2048
DECODE_BATCHES = (1, 4, 16, 64)
# Bumped when prepared cores change in a way older cached cores cannot be loaded or serve the
# checkpoint worse: "images" since programs are stored as program images (cores cached before hold
# pickled programs, now refused); "-templates" since the frontend and sampling defaults come from the
# chat template and generation_config.json (an older core served do_sample: false at temperature 1);
# "-float32" since the core computes in float32 (`DTYPE`; older cores computed in the checkpoint's bfloat16).
CORE_GENERATION = "images-templates-float32"
# The core's compute dtype: float32, as the model was trained and evaluated (training/README.md: float32
# compute on the stored bfloat16 weights, widened exactly), and the dtype the CPU programs' C++ kernels take
# (`helios.runtime.loading.cpu_kernels`: at 16 rows a decode step in about half the time of bfloat16's).
DTYPE = "float32"


class EmbeddedModelMissing(LoadError):
    """The embedded default model's checkpoint is not present in this installation."""


@dataclass(frozen=True)
class EmbeddedCore:
    """A prepared core of the embedded model and what is needed to open it."""

    path: Path
    namespace: str
    public_key: Path


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "helios")


def embedded_core(progress: Callable[[str], None] | None = None) -> EmbeddedCore:
    """The embedded model's core, prepared into the cache on first use (see the module docstring)."""
    from helios.embedded import default_model_dir

    checkpoint = default_model_dir()
    if not (checkpoint / "config.json").is_file():
        raise EmbeddedModelMissing(
            f"the embedded default model is not built in this installation (no checkpoint at {checkpoint}); "
            "pass a MODEL.core to serve"
        )
    root = cache_root() / "embedded"
    root.mkdir(parents=True, exist_ok=True)
    digest = checkpoint_digest(checkpoint)[:16]
    public_key, key_id = _publisher_key(root)
    target = root / f"{digest}-{key_id}-{CORE_GENERATION}"
    if not (target / "model.core").is_file():
        # Preparing reads the private key anyway: the .pub is checked against it first, so a core is
        # never signed by one key and trusted by another's .pub (a stale or replaced file).
        public_key, key_id = _publisher_key(root, match_private=True)
        target = root / f"{digest}-{key_id}-{CORE_GENERATION}"
        if not (target / "model.core").is_file():
            _prepare(checkpoint, target, root / KEY_NAME, progress or _to_stderr)
    return EmbeddedCore(target / "model.core", NAMESPACE, public_key)


def checkpoint_digest(checkpoint: Path) -> str:
    """SHA-256 over the checkpoint's file names and contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        digest.update(path.relative_to(checkpoint).as_posix().encode() + b"\0")
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _publisher_key(root: Path, match_private: bool = False) -> tuple[Path, str]:
    """The cache's publisher key, made on first use: its public key file and a short hex key id (the
    cores it signed are found by it). A public key file lost beside its private key, or one that does
    not parse, is written again from it; a lost private key makes a new pair. With `match_private`,
    a .pub of another key than the private key's is written again too.

    The key id is read from the .pub; the private key is read only to write a lost .pub (and by
    `_prepare`, to sign), so a cache prepared by another user (its private key mode 0600) is served
    while its core and .pub are there. All of it runs under an exclusive lock on `LOCK_NAME`, so
    concurrent first runs take turns: a run coming between another's private key and its .pub wrote
    the .pub itself, the other's exclusive create of it then failed and deleted its private key (or
    the first read that private key half written)."""
    from helios.core.errors import KeyFileError
    from helios.core.keys import PublicKey, SigningKey, load_public_key, load_signing_key, write_key_pair

    key = root / KEY_NAME
    public = root / (KEY_NAME + ".pub")
    with _locked(root / LOCK_NAME):
        if not key.is_file():
            public.unlink(missing_ok=True)  # left behind by a lost private key, it would refuse the new pair
            write_key_pair(key, SigningKey.generate(), [NAMESPACE])
        if public.is_file() and not match_private:
            try:
                return public, load_public_key(public).key_id.hex()[:16]
            except KeyFileError:
                pass  # a damaged .pub: written again from the private key below
        signing = load_signing_key(key)
        if public.is_file() and match_private:
            try:
                if load_public_key(public).key_id == signing.key_id:
                    return public, signing.key_id.hex()[:16]
            except KeyFileError:
                pass
        scratch = root / f".{KEY_NAME}.pub.{os.getpid()}"
        line = PublicKey(signing.public.raw, frozenset({NAMESPACE})).to_line()
        scratch.write_text(f"# Helios Ed25519 public key, key id {signing.key_id.hex()}\n" + line, encoding="ascii")
        os.replace(scratch, public)  # whole or not at all, for a reader without the lock
        return public, signing.key_id.hex()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds an exclusive `flock` on `path` (created if missing) for the block. A run that cannot open
    it for writing (a cache another user made, a read-only file system) goes unlocked: it can only
    read the key files there, not write them."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # for writing: over NFS an exclusive flock needs it
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _prepare(checkpoint: Path, target: Path, key: Path, progress: Callable[[str], None]) -> None:
    from helios.core.keys import load_signing_key
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core

    progress(f"preparing the embedded default model into {target} (first use)")
    plan = CapacityPlan(context_tokens=_context_tokens(checkpoint), decode_batches=DECODE_BATCHES)
    options = PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan, dtype=DTYPE)
    scratch = Path(tempfile.mkdtemp(prefix=".preparing-", dir=target.parent))
    try:
        prepare_core(checkpoint, scratch / "model.core", load_signing_key(key), options, progress=progress)
        try:
            scratch.rename(target)
        except OSError:  # another process finished first; its core is as good as ours
            if not (target / "model.core").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _context_tokens(checkpoint: Path) -> int:
    try:
        config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return CONTEXT_TOKENS
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return min(CONTEXT_TOKENS, limit) if isinstance(limit, int) and limit > 0 else CONTEXT_TOKENS


def _to_stderr(line: str) -> None:
    if sys.stderr is None:  # started with standard error closed (`2>&-`): print would write the line to stdout
        return
    print(f"  {line}", file=sys.stderr, flush=True)
