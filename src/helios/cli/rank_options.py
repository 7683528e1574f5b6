"""The tensor-parallel options of commands that serve a core (`generate`, `serve`).

    add_rank_options(parser)                       # in register()
    options = rank_options_from_args(args)         # -> RankOptions for RuntimeOptions.ranks

They matter only for a core prepared with ``--tensor-parallel N``: by default all N ranks run on
this host (ranks 1..N-1 as local processes); ``--local-ranks K`` keeps K here and waits for the
others to join ``--rendezvous HOST:PORT`` with ``helios rank --join HOST:PORT``.
"""

from __future__ import annotations

import argparse
import math

from helios.errors import UsageError
from helios.runtime.parallel.rank_options import PeerKind, RankOptions, quiet_torch_cpp_log

quiet_torch_cpp_log()  # rank zero's command: `serve` and `generate` import this module before torch

MAX_COUNT = 2**31 - 1  # --local-ranks: past any host's ranks
MAX_SECONDS = 365 * 24 * 3600  # timeouts: a year is "never"; a timedelta of 1e30 seconds overflows


def add_rank_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tensor parallel (cores prepared with --tensor-parallel N)")
    group.add_argument("--local-ranks", type=int, metavar="K",
                       help="ranks on this host, this process included (default: all of the core's ranks)")
    group.add_argument("--rank-peers", choices=[kind.value for kind in PeerKind], default=PeerKind.PROCESSES.value,
                       help="how local ranks 1..K-1 run: one process each (default) or threads of this process")
    group.add_argument("--rendezvous", default="127.0.0.1:0", metavar="HOST:PORT",
                       help="address ranks on other hosts join, with the port they join (default 127.0.0.1 on "
                       "a free port, for local ranks only)")
    group.add_argument("--join-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="how long to wait for every rank to load and join (default 300)")
    group.add_argument("--collective-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="a rank silent this long fails the model (default 60)")


def rank_options_from_args(args: argparse.Namespace) -> RankOptions:
    """The options, checked (`UsageError`, exit 2): counts, positive timeouts up to a year, and a
    `--rendezvous` this host can serve (HOST:PORT, a port 0..65535, an address of this machine)."""
    if args.local_ranks is not None and not 1 <= args.local_ranks <= MAX_COUNT:
        raise UsageError(f"--local-ranks must be in 1..{MAX_COUNT}")
    for name, value in (("--join-timeout", args.join_timeout), ("--collective-timeout", args.collective_timeout)):
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{name} must be a positive number of seconds")
        if value > MAX_SECONDS:  # a timedelta of 1e30 seconds overflows
            raise UsageError(f"{name} must be at most {MAX_SECONDS} seconds (a year)")
    from helios.runtime.parallel.rank_rendezvous import AddressError, serve_address  # torch: at run time only

    try:
        serve_address(args.rendezvous)
    except AddressError as error:
        raise UsageError(f"--rendezvous: {error}") from None
    return RankOptions(
        local_ranks=args.local_ranks, peers=PeerKind(args.rank_peers), rendezvous=args.rendezvous,
        join_timeout_s=args.join_timeout, collective_timeout_s=args.collective_timeout,
        aes_key_file=getattr(args, "aes_key", None),
    )
