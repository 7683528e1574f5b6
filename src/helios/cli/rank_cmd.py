"""`helios rank CORE --join HOST:PORT --accept NS`: serve one tensor-parallel rank for rank zero.

Rank zero (``helios serve`` / ``helios generate`` on a core prepared with ``--tensor-parallel N``)
serves a rendezvous; each rank on another host runs this command with its own copy of the same
core. It takes the next free rank (or ``--rank``), checks that its core is rank zero's, loads its
rank's weights and programs, and then runs every plan rank zero sends until rank zero stops.
Rank zero starts its own local ranks as ``python -m helios.cli.rank_cmd ...`` (this command
alone, without importing every other command).

Every outcome is one line on stderr (``helios rank: ...``, no traceback) and an exit status:

* 0: rank zero stopped the group;
* 2: a bad option, checked before the core is opened (``--join`` not HOST:PORT with a port
  1..65535 or a host that does not resolve, ``--rank`` below 1, ``--device`` not cpu or cuda[:N],
  ``--torch-threads`` outside 1..1024, a ``--join-timeout`` that is not a positive number of seconds
  up to a year), or a
  ``--trust`` or ``--aes-key`` file that cannot be read or is not a key of that kind;
* 3 to 7: the core cannot be opened or verified (3: its contract or manifest breaks a rule) or is
  not admitted (`helios.errors`);
* 8: the rank could not join: rank zero unreachable within ``--join-timeout``, gone before the
  group formed (also while this rank loads), a rank out of range or already taken, a device that
  does not fit rank zero's, a core that is not rank zero's (rank zero is told why) or one not
  prepared for tensor parallelism;
* 9: the group broke while serving (rank zero or another rank lost or silent past the collective
  timeout, or a step message that does not decode), or, for a local rank (``--parent``), rank
  zero's process is gone;
* 130 / 143: stopped by SIGINT / SIGTERM, at any point (joining, loading or serving);
* 1: anything else (an operating-system error, or a fault this list does not name).

The rank runs in a worker thread while the main thread only waits, so a stop signal is handled
at once even while the rank is blocked in the rendezvous or a collective; the process then ends
without the interpreter's teardown (see `_exit_now`), which leaves no process behind.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import sys
import threading
import time
from datetime import timedelta

from helios.runtime.parallel.rank_options import quiet_torch_cpp_log  # imports no torch

MAX_THREADS = 1024  # --torch-threads: as `helios serve` bounds it
MAX_SECONDS = 365 * 24 * 3600  # --join-timeout: as `helios serve` bounds timeouts
_STOP_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

quiet_torch_cpp_log()  # a rank process, starting: before the seconds torch takes to load
if "torch" not in sys.modules:
    # A local rank inherits the stop signals ignored (rank zero's engine process ignores them, and
    # an ignored disposition survives exec): a SIGTERM before `run` installs its handlers was lost,
    # and the rank went on to load and join. Until then a stop signal ends the rank by the signal.
    for _signum in _STOP_SIGNALS:
        if signal.getsignal(_signum) is signal.SIG_IGN:
            signal.signal(_signum, signal.SIG_DFL)

import torch

from helios.abi.collectives import CollectiveError
from helios.cli.core_options import add_core_options, open_core_from_args
from helios.cli.main import printable_line
from helios.cli.stack_dumps import dump_stacks_on_sigusr1
from helios.errors import HeliosError, UsageError
from helios.runtime.parallel.rank_devices import UnsupportedRanksError, parse_device
from helios.runtime.parallel.rank_peers import join_rank
from helios.runtime.parallel.rank_rendezvous import AddressError, Rendezvous, resolve_address


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="serve one tensor-parallel rank of a core for rank zero",
        description="Join rank zero's rendezvous, load this rank of the core and run rank zero's plans "
        "until it stops. The core must be the one rank zero serves.",
        epilog="exit status: 0 rank zero stopped the group; 2 a bad option or key file; 3 to 7 the core cannot "
        "be opened or verified (its contract among it) or is not admitted; 8 the rank could not join (rank zero unreachable or gone, a "
        "rank taken or out of range, a core or device that does not fit rank zero's); 9 the group broke while "
        "serving; 130 / 143 stopped by SIGINT / SIGTERM; 1 anything else.",
    )
    parser.add_argument("core", help="core file (the same core rank zero serves)")
    parser.add_argument("--join", required=True, metavar="HOST:PORT", help="rank zero's rendezvous address")
    parser.add_argument("--rank", type=int, help="rank to serve (default: the next free rank on other hosts)")
    parser.add_argument("--device", help="device of this rank, of the kind rank zero runs on (default: cpu, or "
                        "cuda:0 when rank zero runs on CUDA; several ranks on one host need one GPU each)")
    parser.add_argument("--torch-threads", type=int, help="intra-op threads of this rank (default: torch's)")
    parser.add_argument("--join-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for rank zero (default 60)")
    parser.add_argument("--quiet", action="store_true", help="print nothing unless the rank fails")
    parser.add_argument("--parent", type=int, metavar="PID",
                        help="exit as soon as process PID (rank zero) is gone (how rank zero starts its local ranks)")
    add_core_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    dump_stacks_on_sigusr1()
    for signum, code in _STOP_SIGNALS.items():
        signal.signal(signum, lambda received, frame, code=code: _exit_now(
            code, f"stopped by {signal.Signals(received).name}"))
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.parent is not None:
        _exit_with_parent(args.parent)
    outcome: list = []
    worker = threading.Thread(target=_serve, args=(args, outcome), name="helios-rank", daemon=True)
    worker.start()
    while worker.is_alive():  # the main thread only waits: a stop signal is handled within 0.2 s
        worker.join(0.2)
    code, line = outcome[0] if outcome else (1, "error: the rank ended without an outcome")
    _exit_now(code, line)


def _check_options(args: argparse.Namespace) -> None:
    """Operator mistakes, refused before the core is opened (`UsageError`: exit 2)."""
    if args.rank is not None and args.rank < 1:
        raise UsageError("--rank must be at least 1 (rank zero is the serving process)")
    if args.torch_threads is not None and not 1 <= args.torch_threads <= MAX_THREADS:
        raise UsageError(f"--torch-threads must be 1..{MAX_THREADS}")
    if not (math.isfinite(args.join_timeout) and args.join_timeout > 0):
        raise UsageError("--join-timeout must be a positive number of seconds")
    if args.join_timeout > MAX_SECONDS:  # a timedelta of 1e30 seconds overflows
        raise UsageError(f"--join-timeout must be at most {MAX_SECONDS} seconds (a year)")
    try:
        resolve_address(args.join)
        if args.device is not None:
            parse_device(args.device)
    except (AddressError, UnsupportedRanksError) as error:
        raise UsageError(f"{error}") from None


def _serve(args: argparse.Namespace, outcome: list) -> None:
    """The rank itself (the worker thread): `outcome` gets (exit status, line)."""
    try:
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)  # this thread's intra-op pool too
        core = open_core_from_args(args, args.core)
        if core.prepared.manifest.ranks < 2:
            raise UnsupportedRanksError(f"{args.core} is prepared for one rank; `helios rank` serves a rank of a core "
                                        "prepared with --tensor-parallel N")
        timeout = timedelta(seconds=args.join_timeout)
        rendezvous = Rendezvous.join(args.join, timeout)
        say = (lambda line: None) if args.quiet else _say
        join_rank(core, rendezvous, args.rank, args.device, timeout, on_joined=lambda rank, ranks: say(
            f"serving rank {rank} of {ranks} for {args.join}"))
        outcome.append((0, None if args.quiet else "rank zero stopped the group"))
    except CollectiveError as error:
        outcome.append((error.exit_code, f"error: the group broke (rank zero or another rank is gone or silent): "
                                         f"{error}"))
    except HeliosError as error:
        outcome.append((error.exit_code, f"error: {error}"))
    except OSError as error:  # a file the command cannot read (as `helios.cli.main` reports it)
        where = f": {error.filename}" if error.filename else ""
        outcome.append((1, f"error: {error.strerror or error}{where}"))
    except BaseException as error:  # noqa: BLE001 - one line, never a traceback (see the docstring)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        outcome.append((1, f"error: {type(error).__name__}: {first}"))


def _exit_now(code: int, line: str | None) -> None:
    """Prints `line` and ends the process at once, without the interpreter's teardown: the process
    group's gloo and store destructors talk to rank zero, which may be gone by then, and one of
    them aborted the process (SIGABRT) after a clean stop. Nothing is left to release: rank zero
    owns the group's end, and this process's memory goes with it."""
    if line is not None:  # one line, whatever the error's text holds (a core's unsigned text escaped)
        joined = " | ".join(part.strip() for part in line.splitlines() if part.strip())
        _say(printable_line(joined))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _say(line: str) -> None:
    """One stderr line in one write: a stop signal's line, printed by the main thread, cannot land
    between the worker's text and its newline (`print` writes the two separately)."""
    sys.stderr.write(f"helios rank: {line}\n")
    sys.stderr.flush()


def _exit_with_parent(parent: int) -> None:
    """A local rank must not outlive rank zero, even while it is still loading or joining (or
    stopped: `_continue_when_orphaned`)."""
    _continue_when_orphaned()

    def watch() -> None:
        while os.getppid() == parent:  # a dead parent's children are re-parented
            time.sleep(0.5)
        _exit_now(9, f"error: rank zero's process {parent} is gone")  # no cleanup is owed to its group

    threading.Thread(target=watch, name="helios-parent-watch", daemon=True).start()


def _continue_when_orphaned() -> None:
    """Linux: the kernel sends this process SIGCONT when its parent ends (``PR_SET_PDEATHSIG``). A
    rank stopped (SIGSTOP) when rank zero's process was killed (an engine process stuck in a
    collective with that very rank, killed at the shutdown deadline) stayed stopped for ever, its
    parent watch never running; continued, it notices and exits. SIGCONT does nothing to a running
    rank, also when the kernel sends it early (it tracks the thread that started this process)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parent watch alone
        pass


def run_alone(argv: list[str]) -> int:
    """``helios rank ARGV`` with only this command loaded (errors as `helios.cli.main` reports them)."""
    parser = argparse.ArgumentParser(prog="helios")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rank", *argv])
    try:
        return int(args.func(args) or 0)
    except HeliosError as error:
        print(f"helios rank: error: {printable_line(str(error))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("helios rank: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(run_alone(sys.argv[1:]))
