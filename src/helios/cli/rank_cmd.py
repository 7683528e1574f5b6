"""`helios rank CORE --join HOST:PORT --accept NS`: serve one tensor-parallel rank for rank zero.

Rank zero (``helios serve`` / ``helios generate`` on a core prepared with ``--tensor-parallel N``)
serves a rendezvous; each rank on another host runs this command with its own copy of the same
core. It takes the next free rank (or ``--rank``), checks that its core is rank zero's, loads its
rank's weights and programs, and then runs every plan rank zero sends until rank zero stops (exit
0) or the group breaks (exit 9). Rank zero starts its own local ranks as
``python -m helios.cli.rank_cmd ...`` (this command alone, without importing every other command).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch

from helios.cli.core_options import add_core_options, open_core_from_args
from helios.cli.stack_dumps import dump_stacks_on_sigusr1
from helios.errors import HeliosError, UsageError
from helios.runtime.parallel.rank_peers import join_rank
from helios.runtime.parallel.rank_rendezvous import Rendezvous


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="serve one tensor-parallel rank of a core for rank zero",
        description="Join rank zero's rendezvous, load this rank of the core and run rank zero's plans "
        "until it stops. The core must be the one rank zero serves.",
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
    dump_stacks_on_sigusr1()
    if args.rank is not None and args.rank < 1:
        raise UsageError("--rank must be at least 1 (rank zero is the serving process)")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.parent is not None:
        _exit_with_parent(args.parent)
    core = open_core_from_args(args, args.core)
    timeout = timedelta(seconds=args.join_timeout)
    rendezvous = Rendezvous.join(args.join, timeout)
    say = (lambda line: None) if args.quiet else (lambda line: print(f"helios rank: {line}", file=sys.stderr, flush=True))
    join_rank(core, rendezvous, args.rank, args.device, timeout, on_joined=lambda rank, ranks: say(
        f"serving rank {rank} of {ranks} for {args.join}"))
    say("rank zero stopped the group")
    _exit_stopped()


def _exit_stopped() -> None:
    """A rank that rank zero stopped exits at once, without the interpreter's teardown: its process
    group's gloo and store destructors talk to rank zero, which may be gone by then, and one of them
    aborted the process (SIGABRT) after a clean stop. Nothing is left to release: rank zero owns the
    group's end, and this process's device memory goes with it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _exit_with_parent(parent: int) -> None:
    """A local rank must not outlive rank zero, even while it is still loading or joining."""

    def watch() -> None:
        while os.getppid() == parent:  # a dead parent's children are re-parented
            time.sleep(0.5)
        os._exit(9)  # no cleanup is owed to a group whose rank zero is gone

    threading.Thread(target=watch, name="helios-parent-watch", daemon=True).start()


def run_alone(argv: list[str]) -> int:
    """``helios rank ARGV`` with only this command loaded (errors as `helios.cli.main` reports them)."""
    parser = argparse.ArgumentParser(prog="helios")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rank", *argv])
    try:
        return int(args.func(args) or 0)
    except HeliosError as error:
        print(f"helios rank: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(run_alone(sys.argv[1:]))
