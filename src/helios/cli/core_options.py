"""The `--accept` / `--trust` / `--aes-key` options every command that loads a core shares.

    add_core_options(parser)          # in register()
    core = open_core_from_args(args, args.core)

`--accept NAMESPACE` is required: serving a core means accepting its publisher's terms, and the
string must equal the signed publisher namespace exactly. `--trust` takes KEY.pub files or
directories of them (repeatable); without it the `HELIOS_TRUST` environment variable (paths
separated by the OS path separator) is used, and with neither the command fails.

Key files and cores named on the command line are read through the checks here, so an operator's
mistake is one line, never a hang or an unbounded read: a FIFO nobody writes to reads as empty, a
device such as /dev/zero or a file larger than any key is refused (`read_key_file`), a core must be a
regular file (`check_core_path`), and an output path must be a regular file or absent and may not
name one of the command's inputs (`check_output_path`). A key file that cannot be read or is not a
key of the kind its option takes is the operator's input, so `KeyOptionError`, a usage error
(exit 2), although the library calls it a `KeyFileError` (a core error, exit 4, for a core that
cannot be read).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Mapping

from helios.core.aead import check_aead_key
from helios.core.errors import KeyFileError
from helios.core.keys import PublicKey, SigningKey, TrustedKeys, parse_public_key
from helios.core.reader import Core, open_core
from helios.errors import UsageError

TRUST_ENV = "HELIOS_TRUST"
MAX_KEY_FILE_NBYTES = 64 * 1024  # a PEM private key, a .pub line or 64 hex digits are well under 1 KiB


def add_core_options(parser: argparse.ArgumentParser, *, accept_required: bool = True) -> None:
    """`accept_required=False`: the command checks --accept itself (it may load the embedded model)."""
    group = parser.add_argument_group("trust")
    group.add_argument(
        "--accept",
        required=accept_required,
        metavar="NAMESPACE",
        help="accept the publisher's terms; must equal the core's signed publisher namespace",
    )
    group.add_argument(
        "--trust",
        action="append",
        metavar="KEY.pub|DIR",
        help=f"trusted public key file or directory of *.pub files (repeatable; "
        f"default: ${TRUST_ENV})",
    )
    group.add_argument(
        "--aes-key",
        metavar="FILE",
        help="AES-256 key file (64 hex digits) for version 4 logical-resource cores",
    )


def read_bounded(path: os.PathLike | str, max_nbytes: int) -> bytes | None:
    """The bytes of the file at `path`, or None when it holds more than `max_nbytes`; an OSError
    (IsADirectoryError for a directory) when it cannot be read. Opened without blocking, so a FIFO
    with no writer reads as empty rather than waiting for one (a pipe that has one, as `<(...)`
    gives, is read to its end); reading stops past `max_nbytes`, so /dev/zero ends too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= max_nbytes:
            chunk = handle.read(max_nbytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    return None if total > max_nbytes else b"".join(chunks)


def read_key_file(path: os.PathLike | str, what: str, max_nbytes: int = MAX_KEY_FILE_NBYTES) -> bytes:
    """The bytes of the key file at `path` (`read_bounded`); `KeyFileError` naming `what` and the
    path when it cannot be read or is larger than any key (a core given by mistake, /dev/zero)."""
    try:
        data = read_bounded(path, max_nbytes)
    except OSError as error:
        raise KeyFileError(f"cannot read {what} {path}: {error.strerror or error}") from None
    if data is None:
        raise KeyFileError(f"{what} {path} is larger than any key file ({max_nbytes} bytes at most)")
    return data


class KeyOptionError(UsageError):
    """A key file named by `--key`, `--trust` or `--aes-key` (or a key `keygen` would overwrite)
    that cannot be read or has the wrong form: a usage error, exit 2."""


@contextlib.contextmanager
def key_file_mistakes():
    """A `KeyFileError` raised inside becomes a `KeyOptionError` with the same line."""
    try:
        yield
    except KeyFileError as error:
        raise KeyOptionError(str(error)) from None


def _is_public_key(data: bytes) -> bool:
    try:
        parse_public_key(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, KeyFileError):
        return False
    return True


def load_private_key(path: os.PathLike | str, option: str = "--key") -> SigningKey:
    """The Ed25519 private key file given to `option`, read through `read_key_file`; `KeyOptionError`."""
    with key_file_mistakes():
        return _private_key(path, option)


def _private_key(path: os.PathLike | str, option: str) -> SigningKey:
    data = read_key_file(path, "private key")
    if not data.strip():
        raise KeyFileError(f"{option} {path} is empty; it takes a private key from `helios keygen`")
    if _is_public_key(data):
        raise KeyFileError(f"{option} {path} is a public key; it takes the private key (the file without .pub)")
    try:
        return SigningKey.from_pem(data)
    except KeyFileError as error:
        raise KeyFileError(f"{option} {path}: {error}") from None


def load_public_key_file(path: os.PathLike | str) -> PublicKey:
    data = read_key_file(path, "public key")
    if b"PRIVATE KEY-----" in data:
        raise KeyFileError(f"--trust {path} is a private key; trust takes public keys (KEY.pub)")
    try:
        text = data.decode("utf-8-sig")  # as keygen writes it: a namespace may be non-ASCII
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not a public key file (bytes that are not UTF-8)") from None
    return parse_public_key(text, str(path))


def trusted_keys_from_args(args: argparse.Namespace) -> TrustedKeys:
    """`--trust` (else `$HELIOS_TRUST`): .pub files, and directories whose *.pub files are read."""
    paths = args.trust or [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]
    if not paths:
        raise UsageError(f"no trusted keys: pass --trust KEY.pub|DIR or set {TRUST_ENV}")
    with key_file_mistakes():
        return TrustedKeys.from_paths(paths, load=load_public_key_file)


def refuse_core_keys_without_core(args: argparse.Namespace) -> None:
    """`--trust` or `--aes-key` given to a command that uses the embedded default model (no core
    file named) is refused (exit 2): that core is verified with its own key and prepared unsealed
    on first use, so the keys given would be ignored while the operator believes the model checked
    against them, or a sealed core opened with theirs. `$HELIOS_TRUST`, a default for every command
    rather than a request of this one, is not refused."""
    if args.trust:
        raise UsageError("--trust names the keys a core file is verified with; no core file is given, and the "
                         "embedded default model is verified with its own key (name MODEL.core to use --trust)")
    if getattr(args, "aes_key", None):
        raise UsageError("--aes-key opens a sealed (version 4) core file; no core file is given, and the embedded "
                         "default model is not sealed (name MODEL.core to use --aes-key)")


def load_aes_key(path: os.PathLike | str) -> bytes:
    """An AES-256 key file: 64 hexadecimal digits (surrounding whitespace allowed); `KeyOptionError`."""
    with key_file_mistakes():
        data = read_key_file(path, "AES key")
        try:
            key = bytes.fromhex(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            key = None
        if key is None or len(key) != 32:
            raise KeyFileError(f"--aes-key {path}: an AES key file holds 64 hexadecimal digits")
        return check_aead_key(key)


def aes_key_from_args(args: argparse.Namespace) -> bytes | None:
    return load_aes_key(args.aes_key) if getattr(args, "aes_key", None) else None


def check_core_path(path: os.PathLike | str) -> None:
    """A core is read by offset: a FIFO (whose open would wait for a writer), a device or a socket
    is refused as a usage error. A missing path or a directory is left to the reader's own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise UsageError(f"{path} is not a regular file; a core is a file")


def check_output_path(option: str, output: os.PathLike | str, inputs: Mapping[str, object],
                      streams: bool = False) -> Path:
    """Refuses, before any work, an output path that is a directory, lies in a missing directory,
    is something other than a regular file (a FIFO, a device: the file written beside it and renamed
    into place would replace /dev/null itself, and opening a FIFO would wait for a reader; with
    `streams`, for a command that writes one stream, such an output is written through) or names one
    of the command's inputs (`inputs`: what each is called -> its path or paths), which the written
    file would replace."""
    if str(output).endswith(("/", os.sep)):  # Path drops it: "out/" would be written as the file "out"
        raise UsageError(f"{option} {output} names a directory; name the file to write")
    output = Path(output)
    if output.is_dir():
        raise UsageError(f"{option} {output} is a directory; name the file to write")
    if not output.parent.is_dir():
        raise UsageError(f"{option} {output}: the directory {output.parent} does not exist")
    if _is_link_loop(output):  # the file is written where the link leads: a loop leads nowhere
        raise UsageError(f"{option} {output} is a symbolic link that cannot be followed (a loop)")
    if output.exists() and not output.is_file() and not streams:
        raise UsageError(f"{option} {output} is not a regular file; name the file to write")
    if output.exists():
        for name, paths in inputs.items():
            for path in paths if isinstance(paths, (list, tuple, set, frozenset)) else [paths]:
                if path is not None and _same_file(output, Path(path)):
                    raise UsageError(f"{option} {output} is the {name}; writing there would replace it")
    return output


def _is_link_loop(path: Path) -> bool:
    """Whether following `path` meets a loop of symbolic links (ELOOP): `Path.exists` reads that as
    absent, and resolving the link to write through it raised RuntimeError (a traceback)."""
    try:
        os.stat(path)
    except OSError as error:
        return error.errno == errno.ELOOP
    return False


def check_room_beside(option: str, output: os.PathLike | str) -> None:
    """Refuses, before any work, an output whose directory takes no new file (read-only, a /proc, or
    a name that fits where the temporary file written beside it does not): a file is written as
    ``.NAME.XXXXXXXX.tmp`` beside `output` and renamed into place, so one is created and removed here
    (`helios prepare` otherwise learned it after reading the whole checkpoint)."""
    output = Path(output)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    except OSError as error:
        raise UsageError(f"{option} {output}: cannot create a file beside it ({error.strerror or error})") from None
    os.close(fd)
    os.unlink(name)


@contextlib.contextmanager
def naming_output(output: os.PathLike | str):
    """An OSError raised inside without a file name (a write that failed for want of room, say)
    gets `output`'s, so that its one line says which file could not be written."""
    try:
        yield
    except OSError as error:
        if not error.filename:
            error.filename = str(output)
        raise


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def open_core_from_args(args: argparse.Namespace, path: str) -> Core:
    """Verifies and authorizes the core at `path` with the shared options."""
    check_core_path(path)
    return open_core(
        path,
        accept=args.accept,
        trusted_keys=trusted_keys_from_args(args),
        aes_key=aes_key_from_args(args),
    )
