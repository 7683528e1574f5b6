"""Symbolic links in a checkpoint directory: each one must resolve inside the checkpoint.

Preparation copies what a checkpoint's files hold into a signed core (templates, tokenizer, weights),
and some of it is checked only loosely (a tool-use template is rendered only where tools are given).
A link out of the directory would let a hostile checkpoint carry any file of the preparing machine
(a key, a token) into a core its victim then signs and publishes. So before any file is read,
`check_links(directory)` walks the directory and refuses an entry whose target lies outside it.

One layout is let through: a Hugging Face hub cache snapshot (``<repo>/snapshots/<revision>``),
whose files are links into the repository's ``blobs`` folder; there a link may resolve anywhere
inside ``<repo>``.
"""

from __future__ import annotations

import os
from pathlib import Path

from helios.ignition.architecture import CheckpointError

MAX_ENTRIES = 100_000  # entries walked before the directory is refused as not a checkpoint


def check_links(directory: Path) -> None:
    """Raises `CheckpointError` naming the first link in `directory` (subfolders included) that
    resolves outside the checkpoint, dangles or loops."""
    directory = Path(directory)
    try:
        root = directory.resolve(strict=True)
    except (OSError, RuntimeError) as error:
        raise CheckpointError(f"cannot read the checkpoint directory {directory}: {error}") from None
    inside = _allowed_root(root)
    seen = 0
    for folder, subfolders, files in os.walk(root, followlinks=False, onerror=_unreadable):
        seen += len(subfolders) + len(files)
        if seen > MAX_ENTRIES:
            raise CheckpointError(f"{directory} holds more than {MAX_ENTRIES:,} files and folders: not a checkpoint")
        for name in (*subfolders, *files):
            path = Path(folder, name)
            if path.is_symlink():
                _check_link(path, directory / path.relative_to(root), inside)


def _allowed_root(root: Path) -> Path:
    """Where a link of the checkpoint at `root` may resolve: the checkpoint, or a hub cache repository."""
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        return root.parent.parent
    return root


def _check_link(path: Path, shown: Path, inside: Path) -> None:
    try:
        target = path.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"{shown} is a link to {os.readlink(path)!r}, which does not exist") from None
    except (OSError, RuntimeError) as error:  # a loop, or a target that cannot be read
        raise CheckpointError(f"{shown} is a link that cannot be followed: {error}") from None
    if not target.is_relative_to(inside):
        raise CheckpointError(f"{shown} links to {target}, outside the checkpoint directory; a checkpoint's "
                              "files must lie in it (copy the file in instead of linking it)")


def _unreadable(error: OSError) -> None:
    raise CheckpointError(f"cannot read {error.filename}: {error.strerror}")
