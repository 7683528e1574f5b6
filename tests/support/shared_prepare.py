"""Prepared artifacts shared by the workers of one test run.

Under pytest-xdist every worker has its own session base directory (`<run>/popen-gwN`), so a core
that the session prepares once per base directory would be prepared once per worker. `shared_root`
maps such a base to the run's directory (`<run>`), which all the workers of the run share, and
`prepared_once` builds an artifact there under an exclusive file lock: the first worker to ask
prepares it, the others wait and reuse it. Without xdist the base is used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path


def shared_root(base: Path) -> Path:
    """The directory that every worker of this run shares (`base` itself outside xdist)."""
    base = Path(base)
    return base.parent if base.name.startswith("popen-gw") else base


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepared_once(root: Path, done: Path, prepare: Callable[[], None]) -> None:
    """Runs `prepare` (which must leave `done` behind, written last) unless `done` exists, holding
    `root`'s lock so that concurrent workers prepare it once."""
    if done.exists():
        return
    with _locked(Path(f"{root}.lock")):
        if not done.exists():
            prepare()
