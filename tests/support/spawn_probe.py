"""An engine main for `helios.server.engine_spawn`'s tests: it reports what it was ordered instead of
loading a model."""

from __future__ import annotations

import sys

AHEAD = ("torch", "torch._export.serde.serialize", "helios.frontend.structured.grammar")


def report_order(connection, source, options, torch_threads, serving) -> None:
    """Sends back the order's fields, whether the orphan watch's event is set, and which of `AHEAD`
    the process imported before its order (this main imports nothing), then ends."""
    connection.send((source, options, torch_threads, serving.is_set(), [m for m in AHEAD if m in sys.modules]))


def order_of(args):
    """An `ArgsOrder`'s maker: the order the engine process makes from `args` (a dict here)."""
    from helios.server.engine_spawn import EngineOrder

    return EngineOrder(args["core"], {"made in": "the engine process"}, args.get("threads"))


def refused_order(args):
    """A maker whose flags are refused, as `helios.cli.serve_order.engine_order` refuses a bad flag."""
    from helios.errors import UsageError

    raise UsageError(f"--{args['flag']} is refused")
