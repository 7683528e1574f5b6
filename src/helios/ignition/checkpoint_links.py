"""Symbolic links in a checkpoint directory: each one must resolve inside the checkpoint.

Preparation copies what a checkpoint's files hold into a signed core (templates, tokenizer, weights),
and some of it is checked only loosely (a tool-use template is rendered only where tools are given).
A link out of the directory would let a hostile checkpoint carry any file of the preparing machine
(a key, a token) into a core its victim then signs and publishes. So before any file is read,
`check_links(directory)` walks the directory and refuses an entry whose target lies outside it.

Hugging Face's hub cache is let through: a checkpoint in a snapshot (``<repo>/snapshots/<revision>``,
or a folder inside one) may link anywhere inside ``<repo>``, whose ``blobs`` its files link to; and a
link from anywhere may resolve to a blob of a hub cache repository (``.../models--ORG--NAME/blobs/``,
beside its ``snapshots``), as ``--local-dir`` downloads of huggingface_hub before 0.23 link their
large files. A blob holds a downloaded file, never one of the preparing machine's own.
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
    """Where a link of the checkpoint at `root` may resolve: the checkpoint, or the hub cache
    repository whose snapshot holds it."""
    for folder in (root, *root.parents):
        if folder.parent.name == "snapshots" and _is_hub_repository(folder.parent.parent):
            return folder.parent.parent
    return root


def _is_hub_repository(folder: Path) -> bool:
    """Whether `folder` is a hub cache repository (``models--ORG--NAME`` or another kind's, with
    ``blobs`` and ``snapshots`` folders)."""
    return "--" in folder.name and (folder / "blobs").is_dir() and (folder / "snapshots").is_dir()


def _check_link(path: Path, shown: Path, inside: Path) -> None:
    try:
        target = path.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"{shown} is a link to {os.readlink(path)!r}, which does not exist") from None
    except (OSError, RuntimeError) as error:  # a loop, or a target that cannot be read
        raise CheckpointError(f"{shown} is a link that cannot be followed: {error}") from None
    if not target.is_relative_to(inside) and not _is_hub_blob(target):
        raise CheckpointError(f"{shown} links to {target}, outside the checkpoint directory; a checkpoint's "
                              "files must lie in it (copy the file in instead of linking it)")


def _is_hub_blob(target: Path) -> bool:
    return target.parent.name == "blobs" and _is_hub_repository(target.parent.parent)


def _unreadable(error: OSError) -> None:
    raise CheckpointError(f"cannot read {error.filename}: {error.strerror}")
