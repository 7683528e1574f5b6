"""Writing the files of one core atomically: a single file, or a core file plus sibling parts.

`ContainerWriter` hands out a sink for each stored resource in turn, records where it went, and
on `commit(body)` appends the CoreBody to the core file, writes the header last, fsyncs, and
renames every temporary file into place (parts first, the core file last; an interrupt waits until
they are all renamed, and a rename that fails puts back the files the earlier ones replaced). Until
then nothing exists under the final names; on error (`abort`, or leaving the `with` block by an
exception) every temporary file is removed.

A core written over another core removes, once it is in place, the parts named after it
(``NAME.partNNN``) that the replaced core stored resources in and the new one does not name (a
split into fewer parts, or a join into one file, left them stale beside it), unless the caller
keeps them (`keep`: the parts of the core it copies from, which another core may still read).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable

from google.protobuf.message import DecodeError

from helios.contract import core_pb2
from helios.core.layout import HEADER_NBYTES, CoreHeader, encode_header, read_raw_core
from helios.core.locations import check_sibling_name
from helios.core.records import Placement
from helios.errors import CoreError


def _umask() -> int:
    """The process umask, read without changing it (Linux); 0o022 where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


FILE_MODE = 0o666 & ~_umask()  # what `open` makes a new file (the umask read without changing it)


def _mode_of(final: Path) -> int:
    """The permission bits a file written to `final` gets: those of the file it replaces (a core
    signed or relocated in place keeps its mode, as `helios contract encode`'s output does), else what
    `open` would have made a new file."""
    try:
        return stat.S_IMODE(os.stat(final).st_mode)
    except OSError:
        return FILE_MODE


class _PendingFile:
    """A temporary file beside `final` under an unpredictable name, created exclusively (mode 0600
    until renamed): a file someone placed there beforehand can neither collide with nor be
    written through (no symlink is followed)."""

    def __init__(self, final: Path):
        self.final = final
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        self.temp = Path(name)
        self.handle: BinaryIO = os.fdopen(fd, "wb")

    def finish(self) -> None:
        os.fchmod(self.handle.fileno(), _mode_of(self.final))  # not mkstemp's 0600
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


class ContainerWriter:
    """Owns the temporary files of one core until `commit` or `abort`. Single use; mutable."""

    def __init__(self, path: os.PathLike | str, *, split_nbytes: int | None = None,
                 keep: Iterable[os.PathLike | str] = ()):
        self.path = Path(path)
        self._keep = {Path(kept).name for kept in keep if Path(kept).parent.resolve() == self.path.parent.resolve()}
        if split_nbytes is not None and split_nbytes <= 0:
            raise ValueError("split_nbytes must be positive")
        self._split_nbytes = split_nbytes
        self._main = _PendingFile(self.path)
        self._main.handle.write(bytes(HEADER_NBYTES))  # placeholder; the header is written last
        self._parts: list[_PendingFile] = []
        self._current: tuple[str, BinaryIO, int] | None = None
        self.placements: dict[str, Placement] = {}

    def _target(self) -> tuple[str, _PendingFile]:
        if self._split_nbytes is None:
            return "", self._main
        part = self._parts[-1] if self._parts else None
        if part is None or part.handle.tell() >= self._split_nbytes:
            name = check_sibling_name(f"{self.path.name}.part{len(self._parts):03d}")
            _check_replaceable(self.path.with_name(name))
            part = _PendingFile(self.path.with_name(name))
            self._parts.append(part)
        return part.final.name, part

    def begin_resource(self) -> BinaryIO:
        """The sink for the next resource's stored bytes; call `end_resource` after writing."""
        name, pending = self._target()
        self._current = (name, pending.handle, pending.handle.tell())
        return pending.handle

    def end_resource(self, resource_id: str) -> Placement:
        name, handle, offset = self._current
        self._current = None
        placement = Placement(name, offset, handle.tell() - offset)
        self.placements[resource_id] = placement
        return placement

    def sync_data(self) -> None:
        """Flushes what was written so far to disk (the final commit then has less to sync)."""
        for pending in (self._main, *self._parts):
            pending.handle.flush()
            os.fdatasync(pending.handle.fileno())

    def body_offset(self) -> int:
        return self._main.handle.tell()

    def commit(self, body: bytes) -> tuple[Path, ...]:
        """Appends `body`, writes the header, syncs and renames; returns the final paths."""
        offset = self._main.handle.tell()
        self._main.handle.write(body)
        self._main.handle.seek(0)
        self._main.handle.write(encode_header(CoreHeader(offset, len(body))))
        for pending in (*self._parts, self._main):
            pending.finish()
        stale = _parts_named_by(self.path) - {p.final.name for p in self._parts} - self._keep
        with _signals_held():
            _replace_all((*self._parts, self._main))
        for name in sorted(stale):
            try:
                (self.path.parent / name).unlink()
            except OSError:  # the new core is in place and reads none of them; a leftover is harmless
                pass
        _sync_directory(self.path.parent)
        return tuple(p.final for p in (self._main, *self._parts))

    def abort(self) -> None:
        for pending in (self._main, *self._parts):
            try:
                pending.handle.close()
            except OSError:  # flushing the buffer fails again on a full disk; the file goes anyway
                pass
            pending.temp.unlink(missing_ok=True)

    def __enter__(self) -> "ContainerWriter":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None:
            self.abort()


@contextlib.contextmanager
def _signals_held():
    """SIGINT, SIGTERM and SIGHUP wait until the block ends (their handlers then run): an interrupt
    raised between two renames would leave a core whose parts are new and whose core file is old."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no signal masks here: the rollback alone
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _replace_all(pending: tuple[_PendingFile, ...]) -> None:
    """Renames every temporary file into place, parts first; a rename that fails puts back what the
    earlier ones replaced (each file they replaced was kept under a hard link), so that an existing
    core of that name is left whole, not read as its own core file over the new core's parts."""
    placed: list[tuple[_PendingFile, Path | None]] = []
    try:
        for file in pending:
            kept = _kept_copy(file.final)
            placed.append((file, kept))
            os.replace(file.temp, file.final)
    except BaseException:
        for file, kept in reversed(placed):
            try:
                if kept is not None:
                    os.replace(kept, file.final)
                elif not file.temp.exists():  # this one was renamed into place: nothing stood there before
                    file.final.unlink(missing_ok=True)
            except OSError:  # put back what can be; the error that stopped the commit is the one to report
                pass
        raise
    finally:
        for _, kept in placed:
            if kept is not None:
                kept.unlink(missing_ok=True)  # gone already where it was put back


def _kept_copy(final: Path) -> Path | None:
    """A hard link to the regular file at `final` under a temporary name beside it (None: nothing
    there, or a file system without hard links, where a failed commit cannot put it back)."""
    try:
        if not stat.S_ISREG(os.lstat(final).st_mode):
            return None
    except OSError:
        return None
    for _ in range(8):
        kept = final.with_name(f".{final.name}.{secrets.token_hex(8)}.kept")
        try:
            os.link(final, kept, follow_symlinks=False)
            return kept
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def _check_replaceable(final: Path) -> None:
    """Refuses a part whose name is taken by a directory (or a FIFO, a device, a socket) as soon as
    the part is begun: renaming onto a directory fails only at `commit`, after the parts before it
    had replaced those of an existing core of that name, which then no longer read."""
    try:
        mode = os.lstat(final).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
        raise FileExistsError(errno.EEXIST, "a part of the core would replace this, which is not a regular file",
                              str(final))


def _parts_named_by(core: Path) -> set[str]:
    """The names of the parts named after `core` (``CORE.partNNN``) that the core file now at `core`
    stores resources in; none where no readable core file is there (or something else is: a FIFO is
    never opened)."""
    try:
        if not stat.S_ISREG(os.stat(core).st_mode):
            return set()
        body = core_pb2.CoreBody.FromString(read_raw_core(core).body)
    except (OSError, CoreError, DecodeError):
        return set()
    part = re.compile(re.escape(core.name) + r"\.part[0-9]{3,}")
    return {location.file for location in body.locations.locations if part.fullmatch(location.file)}


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
