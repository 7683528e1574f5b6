"""`helios` entry point: a dispatcher over one module per command family.

Each command module defines `register(subparsers)`, which adds its subcommands and sets
`func(args) -> int` on each. Errors derived from `HeliosError` print one line (control characters
escaped, `printable_line`) and exit with the class's exit code; an operating-system error (a file
that cannot be read or written) prints one line and exits 1; output into a pipe whose reader stopped
(`| head`) ends quietly with status 141, as SIGPIPE would end it; SIGTERM while a command writes a
file ends it with one line and status 143, its temporary file removed (`helios.cli.termination`);
output the locale cannot encode is written as backslash escapes; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from helios import __version__
from helios.cli.termination import Terminated
from helios.core.errors import MissingAeadKeyError
from helios.errors import HeliosError

EXIT_BROKEN_PIPE = 141  # as a shell reports a command SIGPIPE ended (128 + 13)

# The module that registers each command, in the order the commands appear in --help
# (tests/server/test_cli_operations checks it against what the modules register).
COMMANDS = {
    "contract": "helios.cli.contract_cmd",
    **{name: "helios.cli.core_cmd" for name in ("keygen", "sign", "verify", "inspect", "relocate")},
    "prepare": "helios.cli.prepare_cmd",
    "generate": "helios.cli.generate_cmd",
    "serve": "helios.cli.serve_cmd",
    "rank": "helios.cli.rank_cmd",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given the command line `argv`, only its command's module is
    imported where it names one (the others import torch: seconds that `helios verify` need not wait)."""
    parser = argparse.ArgumentParser(
        prog="helios",
        description="Prepared-model LLM serving: prepare, sign, verify, inspect and serve model cores.",
    )
    parser.add_argument("--version", action="version", version=f"helios {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    chosen = _chosen_module(argv)
    for name in COMMAND_MODULES if chosen is None else (chosen,):
        importlib.import_module(name).register(subparsers)
    return parser


def _chosen_module(argv: list[str] | None) -> str | None:
    """The module of the command `argv` names (its first argument: the options before a command take
    no values), or None (no command line, help, or an unknown command: every command is registered)."""
    if argv is None or not argv or argv[0].startswith("-"):
        return None
    return COMMANDS.get(argv[0])


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` selected, whose usage line an error should show."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None))
            if chosen is not None:
                return _command_parser(chosen, args)
    return parser


def main(argv: list[str] | None = None) -> int:
    _escape_unencodable_output()
    try:  # importing the command modules (torch among them) takes seconds: Ctrl-C here is one line too
        parser = build_parser(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print("helios: interrupted", file=_stderr())
        return 130
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Positional lists (generate's prompts) may follow options, and after `--` start with "-" too
        # (argparse leaves a `--` after options among the extras); a lone "-" is a positional too (as
        # argparse takes it before the options: the same prompt wherever it stands); anything else is an error.
        cut = extra.index("--") if "--" in extra else len(extra)
        if not hasattr(args, "prompts") or any(item.startswith("-") and item != "-" for item in extra[:cut]):
            _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        args.prompts = list(args.prompts or []) + extra[:cut] + extra[cut + 1:]
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader of the output stopped early (`| head`): quietly, as SIGPIPE would end it
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except HeliosError as error:
        text = str(error)
        if isinstance(error, MissingAeadKeyError) and hasattr(args, "aes_key"):
            text += "; give it with --aes-key FILE"
        print(f"helios {args.command}: error: {printable_line(text)}", file=_stderr())
        return error.exit_code
    except OSError as error:  # a file the command cannot read or write: one line, no traceback
        where = f": {error.filename}" if error.filename else ""
        print(f"helios {args.command}: error: {printable_line(f'{error.strerror or error}{where}')}", file=_stderr())
        return 1
    except KeyboardInterrupt:
        print(f"helios {args.command}: interrupted", file=_stderr())
        return 130
    except Terminated as stop:  # SIGTERM while writing a file (`helios.cli.termination`): its temporary file removed
        print(f"helios {args.command}: terminated", file=_stderr())
        return stop.exit_code


def _stderr():
    """Standard error, or a sink where the command was started with it closed (``2>&-``): `print`
    with ``file=None`` writes to standard output, among the command's output."""
    return sys.stderr if sys.stderr is not None else open(os.devnull, "w")  # noqa: SIM115 - one line, then exit


def printable_line(text: str) -> str:
    """`text` as one line a terminal shows as it is: newlines, escape sequences, other controls and
    bidirectional overrides written as their Python escapes. An error may quote a core's unsigned
    text (a part file's name), which must neither drive the terminal nor forge a line of its own."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _escape_unencodable_output() -> None:
    """Standard output writes what its encoding cannot (generated text, a non-ASCII path, under an
    ASCII or Latin-1 locale or PYTHONIOENCODING) as backslash escapes, as standard error already
    does, rather than failing with UnicodeEncodeError after the work is done."""
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError, OSError):  # not a text stream that can be reconfigured: left as it is
        pass


def _discard_stdout() -> None:
    """Points standard output at /dev/null, so that the flush at exit has nowhere to fail."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor (a captured stream): nothing to flush into a pipe
        pass


if __name__ == "__main__":
    sys.exit(main())
