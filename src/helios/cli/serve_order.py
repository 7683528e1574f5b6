"""The engine process's load order from `helios serve`'s command line (`engine_order`).

The serving process makes it once its stack is imported, to check the flags and to order a load; for a
core file, the engine process makes it too, from the same flags, as soon as it is started: it is sent
the flags (`helios.server.engine_spawn.ArgsOrder`) before the serving process's imports, so its load
runs beside them (an 8B core's start on an H100 waited 2.2 s for them, bench/results/h100_session67).
Both make it with this module, so both have the same order. The embedded model is ordered by the
serving process only: its first start prepares it there.

Importing this module imports no torch; making an order does (the runtime's option types).
"""

from __future__ import annotations

import argparse
import os

from helios.cli.core_options import TRUST_ENV, aes_key_from_args, check_core_path
from helios.cli.rank_options import rank_options_from_args
from helios.cli.runtime_flags import runtime_flags
from helios.contract import StartupOptions
from helios.errors import UsageError


def serves_core_file(args: argparse.Namespace) -> bool:
    """Whether `helios serve` was given a core file (else it serves the embedded model)."""
    return bool(args.core)


def load_flags(args: argparse.Namespace) -> argparse.Namespace:
    """`args` without what the engine process has no use for: the API key (a secret) and the
    command's function (not a flag)."""
    return argparse.Namespace(**{name: value for name, value in vars(args).items() if name not in ("api_key", "func")})


def core_source(args: argparse.Namespace):
    """How the engine process opens the core file `args.core` (`helios.server.engine_process.CoreSource`)."""
    from helios.server.engine_process import CoreSource

    if not args.accept:
        raise UsageError("--accept NAMESPACE is required to serve a core file")
    check_core_path(args.core)
    keys = args.trust or [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]
    return CoreSource(str(args.core), args.accept, tuple(keys), aes_key_from_args(args))


def runtime_options(args: argparse.Namespace):
    """The runtime's options (`helios.runtime.service.RuntimeOptions`), checked (`UsageError`)."""
    from helios.runtime.service import RuntimeOptions

    ranks = rank_options_from_args(args)
    startup = StartupOptions(max_concurrency=args.max_active, context_tokens=args.context_tokens)
    load, policy, host_pages = runtime_flags(args, startup, args.device)
    return RuntimeOptions(load, args.queue_capacity, policy, host_pages, ranks=ranks)


def engine_order(args: argparse.Namespace):
    """The load order of the core file `args.core` (`helios.server.engine_spawn.EngineOrder`)."""
    from helios.server.engine_spawn import EngineOrder

    return EngineOrder(core_source(args), runtime_options(args), args.torch_threads)
