"""An engine process (`helios.server.engine_process`) whose model load waits: for tests that run `helios serve`
in their own process and signal or kill its engine process while it loads.

    monkeypatch.setattr(serve_cmd, "spawn_engine_process",
                        functools.partial(spawn_engine_process, functools.partial(slow_engine_main, str(mark), 60.0)))

The engine process `helios serve` starts ahead (`helios.server.engine_spawn`) then runs
`slow_engine_main` for its order (pickled by reference), which wraps the runtime's `build_runtime`
there: it writes the engine process's id to `mark`, then waits `delay_s` before loading.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def slow_engine_main(mark: str, delay_s: float, *args) -> None:
    """`engine_process._engine_main(*args)` with a load that first marks `mark` and waits `delay_s`."""
    import helios.runtime.service as service
    from helios.server import engine_process

    build_runtime = service.build_runtime

    def slow_build_runtime(*load_args, **load_kwargs):
        Path(mark).write_text(str(os.getpid()))
        time.sleep(delay_s)
        return build_runtime(*load_args, **load_kwargs)

    service.build_runtime = slow_build_runtime
    engine_process._engine_main(*args)
