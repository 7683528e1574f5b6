"""`helios keygen | sign | verify | inspect | relocate`: making, checking and moving cores.

Exit codes come from the error classes (`helios.errors`): 2 usage (a key file that cannot be read or
is not a key of the kind its option takes among them), 3 contract, 4 core format,
5 integrity (stored bytes), 6 signature, 7 authorization.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import asdict
from pathlib import Path

from helios.cli.core_options import (
    add_core_options, aes_key_from_args, check_core_path, check_output_path, check_room_beside, key_file_mistakes,
    load_private_key, naming_output, open_core_from_args,
)
from helios.cli.termination import terminate_as_exception
from helios.core.envelope import MAX_SIGNATURES
from helios.core.inspection import CoreInspection, inspect_core
from helios.core.keys import SigningKey, check_namespace, write_key_pair
from helios.core.reader import load_unverified
from helios.core.records import ResourceKind
from helios.core.relocate import add_signatures, relocate_core
from helios.errors import UsageError


def through_link(path: Path) -> Path:
    """The file a core is written to for `path`: the file a symbolic link names, as `contract
    encode` writes (the temporary file renamed into place would otherwise replace the link itself,
    and `sign` in place left the core the link names unsigned)."""
    return path.resolve() if path.is_symlink() else path


def _check_new_parts(core: str, output: Path) -> None:
    """Refuses, before anything is written, a split output whose parts (OUT.partNNN) would replace
    a file the core at `core` reads (itself or a part: a core that `sign -o` wrote beside another
    shares its parts, named after that other core) while OUT is another file: the core read would be
    left pointing at parts it no longer tiles. In place, the core read is the one replaced."""
    if _same_file(output, Path(core)):
        return
    part_name = re.compile(re.escape(output.name) + r"\.part[0-9]{3,}")
    for path in (Path(core), *_source_parts(core)):
        if part_name.fullmatch(path.name) and _same_file(path.parent, output.parent):
            raise UsageError(f"-o {output}: its part {path.name} would replace a file of the core {core} it reads")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _keygen(args: argparse.Namespace) -> int:
    for namespace in args.namespace or ():
        try:
            check_namespace(namespace)
        except ValueError as error:
            raise UsageError(f"--namespace: {error}") from None
    output = Path(args.output)
    if output.is_dir():  # "" and "." too, whose file name is empty: no KEY.pub can be named beside them
        raise UsageError(f"-o {output} is a directory; name the private key file to write")
    if args.output.endswith(("/", os.sep)):  # a directory not there yet: Path reads "keys/" as the file "keys"
        raise UsageError(f"-o {args.output} names a directory; name the private key file to write")
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: the directory {output.parent} does not exist")
    key = SigningKey.generate()
    with key_file_mistakes():  # a key already there: exit 2, as for any output the command refuses
        pub_path = write_key_pair(Path(args.output), key, args.namespace or ())
    # Paths go through `one_line`: a newline in a file name would start a line of the report's own.
    print(f"wrote {one_line(args.output)} (private, keep secret) and {one_line(str(pub_path))}")
    print(f"key id {key.key_id.hex()}")
    return 0


def _source_parts(core: str) -> list[Path]:
    """The sibling part files the core at `core` stores resources in (none for a single file)."""
    loaded = load_unverified(core)
    return [loaded.path.parent / p.file for p in loaded.placements.values() if p.file]


def _check_signature_count(args: argparse.Namespace, keys: list[SigningKey]) -> None:
    """Refuses, before anything is written, a key given twice or one that already signed the core
    (unless `--replace`), and more signatures than any reader accepts (`MAX_SIGNATURES`): the
    signed core, in place too, could no longer be read."""
    ids = [key.key_id for key in keys]
    if len(set(ids)) != len(ids):
        raise UsageError("--key names the same key more than once")
    signers = () if args.replace else load_unverified(args.core).signers
    for key in keys:
        if any(signer.key_id == key.key_id for signer in signers):
            raise UsageError(f"key {key.key_id.hex()} already signed this core (--replace re-signs it)")
    kept = len(signers)
    if kept + len(keys) > MAX_SIGNATURES:
        raise UsageError(f"a core holds at most {MAX_SIGNATURES} signatures; it has {kept} and --key adds "
                         f"{len(keys)} (--replace drops the existing ones)")


def _sign(args: argparse.Namespace) -> int:
    check_core_path(args.core)
    keys = [load_private_key(path) for path in args.key]
    _check_signature_count(args, keys)
    if args.output:
        check_output_path("-o", args.output, {"--key file": args.key, "--aes-key file": args.aes_key,
                                              "public key of --key": [f"{key}.pub" for key in args.key],
                                              "part file of the core": _source_parts(args.core)})
    destination = through_link(Path(args.output or args.core))
    check_room_beside("-o" if args.output else "CORE", destination)  # else the error names a temporary file
    with terminate_as_exception(), naming_output(destination):
        files = add_signatures(
            args.core, destination, keys, replace=args.replace,
            aes_key=aes_key_from_args(args),
        )
    ids = ", ".join(key.key_id.hex() for key in keys)
    print(f"signed {one_line(str(files[0]))} with key {ids}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    core = open_core_from_args(args, args.core)
    decoded = core.verify_resources()
    stored = sum(info.stored_nbytes for info in core.resources)
    signers = ", ".join(key.key_id.hex() for key in core.admitted_signers)
    # A newline in the core's file name would forge a line of its own ("signed by trusted key ...").
    print(one_line(f"verified {args.core}: {core.core_format.name}, publisher {core.publisher.namespace}"))
    print(f"  signed by trusted key {signers}")
    print(f"  {len(core.resources)} resources: {stored} stored bytes, {decoded} decoded bytes")
    pickled = [info.id for info in core.resources if info.kind.is_program and info.kind is not ResourceKind.PROGRAM_IMAGE]
    if pickled:
        print(f"  {len(pickled)} programs are torch.export.save archives, which loading would unpickle: serving "
              "refuses this core; prepare it again with `helios prepare`")
    return 0


def terminal_text(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, other controls,
    bidirectional overrides) written as its Python escape, newlines kept: a core's strings are the
    publisher's, unverified under `inspect`, and must not drive the reader's terminal."""
    return "".join(ch if ch.isprintable() or ch == "\n" else ch.encode("unicode_escape").decode("ascii") for ch in text)


def one_line(text: str) -> str:
    """`terminal_text` with newlines escaped too, for a core's string that stands in one line of a
    report (a resource id, a graph name, a file name): a newline in it would start a line of its
    own, which could pass for one `inspect` writes (a resource, a signature "valid")."""
    return terminal_text(text).replace("\n", "\\n")


def continued(text: str) -> str:
    """A core's text of several lines (a license) with each line after its first marked ``  | ``:
    no line of it can pass for one `inspect` writes (a signature reported "valid")."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\n  | ")


def _inspection_lines(report: CoreInspection) -> list[str]:
    # Every string of the core is escaped into its one line (`one_line`) but the license and the
    # acceptance terms, whose text may run over several lines, each after the first marked (`continued`).
    c = report.contract
    lines = [
        "UNVERIFIED: signatures checked for form only; no key trusted, nothing authorized,",
        "no stored resource read. Use `helios verify` before trusting any of this.",
        f"core: {one_line(report.path)}",
        f"format: {report.core_format.name}",
        f"publisher namespace: {one_line(report.publisher.namespace)}",
        f"license: {continued(report.publisher.license or '-')}",
        f"acceptance terms: {continued(report.publisher.acceptance_terms or '-')}",
        "signatures:",
        *(f"  key {s.key_id}: {'valid' if s.is_valid else 'INVALID'}" for s in report.signatures),
        f"contract: {one_line(c.served_id)} (aliases: {one_line(', '.join(c.aliases)) or '-'}), model contract "
        f"v{c.model_version}, {c.ranks} rank(s)",
        f"  capacities: context {c.context_tokens}, prefill {c.prefill_tokens}, pages "
        f"{c.page_capacity}, snapshots {c.snapshot_capacity}, concurrency {c.max_concurrency}, "
        f"speculative widths {list(c.speculative_widths)}",
        *(f"  graph {one_line(g.name)} ({g.operation}): {', '.join(g.variants)}" for g in c.graphs),
        f"  contract check: {one_line(report.contract_problem or 'ok')}",
        f"resources: {len(report.resources)}",
    ]
    for info in report.resources:
        place = report.placements.get(info.id)
        where = f"{one_line(place.file) or '(core file)'}@{place.offset}" if place else "?"
        rank = "all" if info.rank is None else info.rank
        lines.append(
            f"  {one_line(info.id)}  {info.kind.name}  rank {rank}  stored {info.stored_nbytes}  "
            f"decoded {info.decoded_nbytes}  at {where}"
        )
    if report.location_problem:
        lines.append(f"location problem: {one_line(report.location_problem)}")
    if report.ignored_catalogs:
        lines.append(f"ignored weight catalogs of unknown versions: {report.ignored_catalogs}")
    return lines


def _inspection_json(report: CoreInspection) -> dict:
    return {
        "is_verified": report.is_verified,
        "path": report.path,
        "core_format": report.core_format.name,
        "publisher": asdict(report.publisher),
        "signatures": [asdict(s) for s in report.signatures],
        "contract": asdict(report.contract),
        "contract_problem": report.contract_problem,
        "resources": [{**asdict(r), "kind": r.kind.name} for r in report.resources],
        "placements": {rid: asdict(p) for rid, p in report.placements.items()},
        "location_problem": report.location_problem,
        "ignored_catalogs": report.ignored_catalogs,
    }


def _inspect(args: argparse.Namespace) -> int:
    check_core_path(args.core)
    report = inspect_core(args.core)
    if args.json:
        print(json.dumps(_inspection_json(report), indent=2, sort_keys=True))
    else:
        print(terminal_text("\n".join(_inspection_lines(report))))
    return 0


def _relocate(args: argparse.Namespace) -> int:
    if args.split_bytes is not None and args.split_bytes <= 0:
        raise UsageError("--split-bytes must be positive")
    check_core_path(args.core)
    check_output_path("-o", args.output, {"part file of the core": _source_parts(args.core)})
    destination = through_link(Path(args.output))
    check_room_beside("-o", destination)  # else the error names a temporary file
    if args.split_bytes is not None:
        _check_new_parts(args.core, destination)
    with terminate_as_exception(), naming_output(destination):
        files = relocate_core(args.core, destination, split_nbytes=args.split_bytes)
    print(f"wrote {len(files)} file(s): {', '.join(one_line(str(f)) for f in files)}")
    return 0


def register(subparsers) -> None:
    keygen = subparsers.add_parser(
        "keygen", help="create an Ed25519 signing key pair",
        description="Write a new Ed25519 private key to KEY (mode 0600) and its public key to KEY.pub; "
        "neither file may exist already.",
    )
    keygen.add_argument("-o", "--output", required=True, metavar="KEY",
                        help="private key path; the public key goes to KEY.pub")
    keygen.add_argument("--namespace", action="append", metavar="NS",
                        help="scope KEY.pub to this publisher namespace (repeatable)")
    keygen.set_defaults(func=_keygen)

    sign = subparsers.add_parser(
        "sign", help="add (or replace) signatures on a core",
        description="Check every existing signature and stored byte of CORE, then add a signature by each "
        "--key (with --replace, instead of the existing ones), in place or to OUT.",
    )
    sign.add_argument("core", metavar="CORE", help="core file to sign")
    sign.add_argument("--key", action="append", required=True, metavar="KEY",
                      help="private key file (repeatable)")
    sign.add_argument("-o", "--output", metavar="OUT",
                      help="write here instead of in place (default: CORE itself); never a --key file")
    sign.add_argument("--replace", action="store_true", help="drop the existing signatures")
    sign.add_argument("--aes-key", metavar="FILE",
                      help="AES-256 key file to check version 4 resources first (default: they are copied unchecked)")
    sign.set_defaults(func=_sign)

    verify = subparsers.add_parser(
        "verify", help="verify signatures, authorization and every stored byte of a core",
        description="Check that a trusted key signed CORE, that --accept equals its publisher namespace and "
        "that every stored byte matches its signed digest; exit 0 only then (2 usage, 3 a contract or "
        "manifest that breaks a rule, a resource it names missing among them, 4 unreadable core, 5 stored bytes, "
        "6 signature, 7 authorization).",
    )
    verify.add_argument("core", metavar="CORE", help="core file to verify")
    add_core_options(verify)
    verify.set_defaults(func=_verify)

    inspect = subparsers.add_parser(
        "inspect", help="show what a core claims (unverified)",
        description="Print what CORE claims: publisher, signatures (checked for form only), contract and "
        "resources. Nothing is trusted or read beyond the signed payload: use `helios verify` before "
        "trusting any of it.",
    )
    inspect.add_argument("core", metavar="CORE", help="core file to inspect")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(func=_inspect)

    relocate = subparsers.add_parser(
        "relocate", help="rewrite a core as one file or split parts, without re-signing",
        description="Copy CORE to OUT as one file, or with --split-bytes as OUT plus OUT.partNNN siblings, "
        "checking every stored chunk against its signed digest on the way; the signed payload is unchanged.",
    )
    relocate.add_argument("core", metavar="CORE", help="core file to read")
    relocate.add_argument("-o", "--output", required=True, metavar="OUT",
                          help="core file to write (may be CORE itself, not one of its part files)")
    relocate.add_argument("--split-bytes", type=int, metavar="N",
                          help="split into sibling parts of about N bytes (default: one file)")
    relocate.set_defaults(func=_relocate)
