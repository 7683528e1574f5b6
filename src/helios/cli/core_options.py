"""The `--accept` / `--trust` / `--aes-key` options every command that loads a core shares.

    add_core_options(parser)          # in register()
    core = open_core_from_args(args, args.core)

`--accept NAMESPACE` is required: serving a core means accepting its publisher's terms, and the
string must equal the signed publisher namespace exactly. `--trust` takes KEY.pub files or
directories of them (repeatable); without it the `HELIOS_TRUST` environment variable (paths
separated by the OS path separator) is used, and with neither the command fails.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from helios.core.aead import load_aead_key
from helios.core.keys import TrustedKeys
from helios.core.reader import Core, open_core
from helios.errors import UsageError

TRUST_ENV = "HELIOS_TRUST"


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


def trusted_keys_from_args(args: argparse.Namespace) -> TrustedKeys:
    paths = args.trust or [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]
    if not paths:
        raise UsageError(f"no trusted keys: pass --trust KEY.pub|DIR or set {TRUST_ENV}")
    return TrustedKeys.from_paths(Path(p) for p in paths)


def aes_key_from_args(args: argparse.Namespace) -> bytes | None:
    return load_aead_key(Path(args.aes_key)) if getattr(args, "aes_key", None) else None


def open_core_from_args(args: argparse.Namespace, path: str) -> Core:
    """Verifies and authorizes the core at `path` with the shared options."""
    return open_core(
        path,
        accept=args.accept,
        trusted_keys=trusted_keys_from_args(args),
        aes_key=aes_key_from_args(args),
    )
