"""An engine main for `helios.server.engine_spawn`'s tests: it reports what it was ordered instead of
loading a model, so a spawned process needs none of the runtime's imports."""

from __future__ import annotations

import sys


def report_order(connection, source, options, torch_threads, serving) -> None:
    """Sends back the order's fields, whether the orphan watch's event is still clear and whether
    the runtime was imported, then ends."""
    connection.send((source, options, torch_threads, serving.is_set(), "torch" in sys.modules))
