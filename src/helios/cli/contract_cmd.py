"""`helios contract check|show|encode`: validate, print and convert prepared contracts.

FILE is either the semantic JSON form (``{"contract": ..., "manifest": ...}``) or the binary
form (an encoded PreparedContractBundle); the first non-whitespace byte ``{`` selects JSON.
``-`` reads standard input, and as `encode`'s OUT writes standard output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from helios.cli.core_cmd import one_line, through_link
from helios.cli.core_options import (
    check_output_path, check_room_beside, load_private_key, naming_output, read_bounded,
)
from helios.cli.termination import terminate_as_exception
from helios.contract import PreparedContract
from helios.contract.files import load_bytes
from helios.contract.rules import enum_label
from helios.core.container import FILE_MODE
from helios.core.layout import MAGIC as CORE_MAGIC
from helios.contract import serving_pb2 as spb
from helios.errors import UsageError

FILE_HELP = "contract file: semantic JSON, or the binary PreparedContractBundle; '-' reads stdin"
MAX_CONTRACT_NBYTES = 64 * 1024 * 1024  # the full example contract is 80 KB


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "contract",
        help="validate, print and convert prepared serving contracts",
        description="Validate, print and convert a serving contract plus execution manifest. " + FILE_HELP + ".",
    )
    commands = parser.add_subparsers(dest="contract_command", metavar="SUBCOMMAND")
    commands.required = True
    check = commands.add_parser("check", help="validate FILE; exit 0 when every rule holds", description=(
        "Decode FILE and check every contract rule. Prints one summary line on success; on the first "
        "violated rule prints 'field.path: reason' and exits 3."))
    check.add_argument("file", metavar="FILE", help=FILE_HELP)
    check.set_defaults(func=_check)
    show = commands.add_parser("show", help="print FILE as canonical semantic JSON", description=(
        "Decode and validate FILE, then print it as canonical semantic JSON (the form "
        "PreparedContract.to_json writes). --settings prints the settings resolved from the core defaults instead."))
    show.add_argument("file", metavar="FILE", help=FILE_HELP)
    show.add_argument("--settings", action="store_true", help="print resolved default settings as JSON")
    show.set_defaults(func=_show)
    encode = commands.add_parser("encode", help="write FILE in the binary bundle form", description=(
        "Decode and validate FILE, then write it to OUT as an encoded PreparedContractBundle."))
    encode.add_argument("file", metavar="FILE", help=FILE_HELP)
    encode.add_argument("out", metavar="OUT", help="output path of the binary form; '-' writes stdout")
    encode.set_defaults(func=_encode)
    core = commands.add_parser("example-core", help="prepare FILE into a signed core of tiny random programs",
                               description=(
        "Prepare the contract in FILE into a signed core without a checkpoint: one generated program per "
        "graph handle (a small next-token model with random weights, drafting, verification, image encoding "
        "and host-table lookups where the graphs declare them), random weights of the declared shapes, a "
        "byte-level tokenizer with the contract's special tokens at their ids and a chat template from its "
        "assistant boundary. The core loads and serves like a prepared one: use it to try a contract end to "
        "end. Every weight is materialised: use a contract of small sizes, e.g. examples/contract-tiny.json."))
    core.add_argument("file", metavar="FILE", help=FILE_HELP)
    core.add_argument("-o", "--output", required=True, metavar="OUT", help="path of the core to write")
    core.add_argument("--key", required=True, metavar="KEY", help="Ed25519 private key (from `helios keygen`)")
    core.add_argument("--namespace", required=True, metavar="NS", help="publisher namespace signed into the core")
    core.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random weights (default 0)")
    core.set_defaults(func=_example_core)


def _load(name: str) -> PreparedContract:
    """The contract in file `name` (or stdin), read to at most `MAX_CONTRACT_NBYTES`: a larger file,
    a device or a FIFO with no writer is one line, never an unbounded read or a wait."""
    try:
        if name == "-":
            if sys.stdin is None:  # started with standard input closed (`<&-`)
                raise UsageError("cannot read -: standard input is closed")
            data = sys.stdin.buffer.read(MAX_CONTRACT_NBYTES + 1)
            data = None if len(data) > MAX_CONTRACT_NBYTES else data
        else:
            data = read_bounded(name, MAX_CONTRACT_NBYTES)
    except OSError as error:
        raise UsageError(f"cannot read {name}: {error.strerror or error}") from None
    if data is None:
        raise UsageError(f"{name} is larger than any contract ({MAX_CONTRACT_NBYTES} bytes at most)")
    if data.startswith(CORE_MAGIC):  # read as a bundle it was "Wire format was corrupt", which said nothing
        where = "standard input holds" if name == "-" else f"{name} is"
        raise UsageError(f"{where} a core, not a contract file; `helios inspect CORE` shows the contract a core holds")
    return load_bytes(data)


def _check(args: argparse.Namespace) -> int:
    prepared = _load(args.file)
    counts = ", ".join(
        f"{len(prepared.graphs_for(op))} {enum_label(spb.GraphOperation, op)}"
        for op in spb.GraphOperation.values()
        if prepared.graphs_for(op)
    )
    print(
        f"ok: {prepared.contract.served_id} (contract v{prepared.version}; "
        f"{len(prepared.graphs)} graphs: {counts}; {len(prepared.buffers)} buffers)"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    prepared = _load(args.file)
    if args.settings:
        print(json.dumps(dataclasses.asdict(prepared.defaults), indent=2))
    else:
        sys.stdout.write(prepared.to_json())
    return 0


def _example_core(args: argparse.Namespace) -> int:
    from helios.core.keys import check_namespace
    from helios.ignition.contract_core import write_contract_core

    try:
        check_namespace(args.namespace)
    except ValueError as error:
        raise UsageError(f"--namespace: {error}") from None
    if not 0 <= args.seed < 2**63:
        raise UsageError("--seed must be in [0, 2**63)")
    output = check_output_path("-o", args.output, {"--key file": args.key, "public key of --key": f"{args.key}.pub",
                                                   "contract FILE": args.file})
    output = through_link(output)  # as sign, relocate and encode write: the link itself was replaced
    check_room_beside("-o", output)  # else a failed write names the temporary file beside it
    key = load_private_key(args.key)
    prepared = _load(args.file)
    with terminate_as_exception(), naming_output(output):
        write_contract_core(prepared, output, key, args.namespace, args.seed)
    print(f"wrote {one_line(args.output)}: {len(prepared.manifest.graph_handles)} programs of "
          f"{one_line(prepared.contract.served_id)}")
    return 0


def _encode(args: argparse.Namespace) -> int:
    if args.out == "-":  # as FILE "-" reads standard input; a file named "-" was written instead
        return _encode_to_stdout(args)
    output = check_output_path("OUT", args.out, {"contract FILE": args.file}, streams=True)
    prepared = _load(args.file)
    is_stream = output.exists() and not output.is_file()  # /dev/stdout, a FIFO, process substitution
    if not is_stream:
        check_room_beside("OUT", output.resolve())  # else a failed write names the temporary file beside it
    with terminate_as_exception(), naming_output(output):
        if is_stream:
            with open(output, "wb") as stream:
                stream.write(prepared.to_bundle())
        else:
            _write_replacing(output.resolve(), prepared.to_bundle())  # through a link, as an open would
    print(f"wrote {args.out}", file=sys.stderr if is_stream else sys.stdout)  # stdout may be the stream
    return 0


def _encode_to_stdout(args: argparse.Namespace) -> int:
    if sys.stdout is None:  # started with standard output closed (`>&-`)
        raise UsageError("OUT -: standard output is closed")
    bundle = _load(args.file).to_bundle()
    sys.stdout.flush()
    sys.stdout.buffer.write(bundle)
    sys.stdout.flush()
    if sys.stderr is not None:  # closed (`2>&-`): print would write the line into the bundle
        print("wrote standard output", file=sys.stderr)
    return 0


def _write_replacing(output: Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `output` and renames it into place, with the mode of
    the file it replaces (else what a plain open would make): a write that fails (a full disk) or is
    interrupted (Ctrl-C, SIGTERM) leaves any earlier `output` as it was and no partial file; the
    OSError reaches `main` (exit 1)."""
    try:
        mode = stat.S_IMODE(os.stat(output).st_mode)
    except FileNotFoundError:
        mode = FILE_MODE
    fd, name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)  # not mkstemp's 0600
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(name, output)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
