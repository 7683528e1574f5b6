"""`helios serve`'s model worker in a process of its own (the default; `--no-engine-process` keeps
it a thread of the serving process).

The serving process opens and verifies the core (so trust and usage errors are its own, as
before), then orders the engine process (started ahead by `helios.server.engine_spawn`, so its
imports ran beside the serving process's, or started here: `multiprocessing`, spawn) to load it,
with where the core is and how to load it, and builds its own frontend's tokenizer and grammar
compiler meanwhile (`while_loading`, `helios.server.frontend_ahead`). The engine process opens the
core again (by path: it must be the core the serving process verified, the same signed body, else
`CoreReplacedError`: checked before its load where the order carries the digest, and on its ready
record where the order went ahead of the serving process's open), loads it, starts the engine and
serves it over `helios.runtime.engine_link` (grammar matchers compiled again there from their
source, against the same tokenizer, by a compiler built once the process is ready, on a compile
thread that the command loop never waits for: `helios.server.engine_grammars`); its first message is
its readiness (the tokenizer and chat template it loaded, and its first stats) or its startup
error, re-raised here with its type and exit code. The serving process never loads weights or
touches the device.

The engine process ignores SIGINT, SIGTERM and SIGHUP, and SIGUSR1 prints its threads' stacks (as in the
serving process, `helios.cli.stack_dumps`) rather than ending it (`helios.server.engine_spawn`):
the serving process decides when it stops (`Shutdown` over the pipe, after the HTTP drain; a kill
when interrupted while it loads) and it stops by itself when the serving process is gone, also
while it loads (no pipe is read then: a thread watches its parent). `EngineProcessRuntime` stands
where `helios.runtime.service.Runtime` does for `ServedModel`: `model` (what the frontend reads),
`engine` (the link) and `close`, and `connection`, the pipe end the link writes, whose backlog
`helios.server.engine_commands` reads.
The engine process's command loop sends a heartbeat every second; one that sends none for the
liveness timeout (`helios serve --liveness-timeout`) is reported unresponsive, not killed. Each
heartbeat carries the model worker's progress: requests pending and no round completed for that
timeout (a step stuck in a device sync, a collective or a native call) is reported stalled, not
killed.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helios.contract import PreparedContract, ResolvedSettings, resolve_settings
from helios.errors import CoreError, ExecutionError, HeliosError
from helios.runtime.engine_link import (
    DEFAULT_LIVENESS_TIMEOUT_S, EngineLink, ended_how, serve_link, stats_of, wait_ready,
)
from helios.runtime.service import RuntimeOptions
from helios.runtime.host_heap import hold_freed_memory
from helios.server.engine_spawn import EngineOrder, EngineSpawn, spawn_engine_process
from helios.server.heap import freeze_startup_heap
from helios.server.start_trace import mark

STARTUP_TIMEOUT_S = 3600.0  # a large core on a cold disk loads for minutes
# What a load imports after its order beyond this module's imports, made while the engine process waits
# for it (`helios.server.engine_spawn`, `ahead_imports`): the grammar compiler and the core reader; on
# the CPU torch's program deserializer and export tracing (the CPU programs are built through them) and
# what the C++ kernels' build reads: about 3 s of a CPU load's imports on a 2-core machine.
LOAD_IMPORTS = ("helios.core.reader", "helios.frontend.structured.grammar", "tokenizers")
CPU_LOAD_IMPORTS = ("torch._export.serde.serialize", "torch.export._trace", "torch.utils.cpp_extension",
                    "torch._inductor.sizevars", "sympy.tensor.tensor")


@dataclass(frozen=True)
class CoreSource:
    """How the engine process opens the core the serving process verified."""

    path: str
    accept: str
    trusted_keys: tuple[str, ...]  # public key files or directories
    aes_key: bytes | None = None
    # The signed body the serving process verified (`Core.body_sha256`): the engine process opens the
    # file by path again, and refuses another core found there (a redeploy that wrote a new core under
    # the same name between the two opens). None: not known yet (an order made ahead from the command
    # line, before the serving process opened the core: its ready record is checked instead).
    body_sha256: bytes | None = None


class CoreReplacedError(CoreError):
    """The engine process opened a core other than the one the serving process verified (the file
    was replaced between the two opens)."""


@dataclass(frozen=True)
class _Ready:
    tokenizer_json: bytes
    chat_template: str
    stats: tuple
    body_sha256: bytes  # the signed body of the core the engine process loaded


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class FrontendView:
    """What the frontend reads of the model (the fields of `LoadedModel` it uses)."""

    prepared: PreparedContract
    settings: ResolvedSettings
    tokenizer_json: bytes
    chat_template: str


@dataclass(frozen=True)
class EngineProcessRuntime:
    model: FrontendView
    engine: EngineLink
    connection: object = None  # the pipe end `engine` writes (`helios.server.engine_commands` reads its backlog)

    def close(self) -> None:
        """Stops the engine process (idempotent)."""
        self.engine.shutdown()


def start_engine_process(source: CoreSource, prepared: PreparedContract, options: RuntimeOptions,
                         torch_threads: int | None = None,
                         timeout_s: float = STARTUP_TIMEOUT_S,
                         liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S,
                         spawned: EngineSpawn | None = None,
                         while_loading: Callable[[], object] | None = None) -> EngineProcessRuntime:
    """Orders the engine process to load (`spawned`, started ahead; None: one started here) and
    waits until it serves; raises its startup error, and stops the process on any failure.
    `while_loading` is called once the order is sent, before the wait: the serving process's own
    start work that runs beside the load (it must not block).
    `liveness_timeout_s`: seconds without its heartbeat after which the link reports it
    unresponsive (`EngineLink.unresponsive_reason`, `/health` 503), and without a completed round
    while requests are pending after which it reports it stalled (`EngineLink.stalled_reason`)."""
    try:
        settings = resolve_settings(prepared, options.load.startup)  # options the core refuses fail before a load
    except BaseException:
        if spawned is not None:
            spawned.discard()
        raise
    if spawned is None:
        spawned = spawn_engine_process(_engine_main)  # looked up now: tests replace it
    process, connection = spawned.process, spawned.connection
    is_late = False
    try:
        try:
            if spawned.ordered_ahead:  # it made this same order from the command line, and loads already
                spawned.take()
            else:
                spawned.order(EngineOrder(source, options, torch_threads))
        except OSError:  # it ended before its order: how is said below
            message = None
        else:
            mark("serve: engine process taken over" if spawned.ordered_ahead else "serve: load ordered")
            if while_loading is not None:
                while_loading()
            waited_from = time.monotonic()
            message = wait_ready(connection, timeout_s, process.is_alive)
            is_late = message is None and time.monotonic() - waited_from >= timeout_s
            mark("serve: engine ready")
    except BaseException:  # interrupted while it loads: nothing to drain, so it is killed
        _stop_unready(process, connection)
        raise
    if isinstance(message, _Ready) and source.body_sha256 is not None and message.body_sha256 != source.body_sha256:
        message = _Failed(_replaced(source, message.body_sha256))  # loaded ahead, before this process opened it
    if not isinstance(message, _Ready):
        _stop_unready(process, connection)
        if isinstance(message, _Failed):
            raise message.error
        # Late by the clock, not by `is_alive`: a process that crashed closed its pipe before it was
        # reaped, so it may still look alive when the wait ends on that end of file.
        if is_late:  # (else the kill itself would be reported as how it ended)
            raise ExecutionError(f"the engine process did not become ready within {timeout_s:g} s (it was stopped)")
        raise ExecutionError(f"{ended_how(process)} while starting")
    view = FrontendView(prepared, settings, message.tokenizer_json, message.chat_template)
    return EngineProcessRuntime(view, EngineLink(connection, process, stats_of(message.stats), liveness_timeout_s),
                                connection)


def warm_device(device: str) -> threading.Thread | None:
    """On a CUDA `device` (as the command line names it), starts a thread that makes the device's
    context and cuBLAS ready (a small bfloat16 product: the CUDA driver's start and cuBLAS's libraries,
    which the load's first device work waits for otherwise) while the engine process waits for its
    order; None elsewhere. A device that cannot start is left to the load, which reports it."""
    if device.partition(":")[0].strip() != "cuda":
        return None

    def warm() -> None:
        try:
            import torch

            named = torch.device(device.strip())
            with torch.cuda.device(named if named.index is not None else torch.cuda.current_device()):
                square = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
                torch.mm(square, square)
                torch.cuda.synchronize()
            mark("engine: device warmed")
        except Exception:  # noqa: BLE001 - the load starts the device itself and reports what fails
            pass

    thread = threading.Thread(target=warm, name="helios-device-warm", daemon=True)
    thread.start()
    return thread


def ahead_imports(device: str) -> tuple[str, ...]:
    """The modules a load on `device` (as the command line names it) imports once ordered. Off the
    CPU not torch's deserializer: it pulls in torch._dynamo, which a CUDA load never imports
    (`helios.runtime.loading.graph_image`)."""
    return LOAD_IMPORTS + (CPU_LOAD_IMPORTS if device.partition(":")[0].strip() == "cpu" else ())


def _stop_unready(process, connection) -> None:
    if process.is_alive():
        process.kill()
    process.join(10)
    connection.close()


def _engine_main(connection, source: CoreSource, options: RuntimeOptions, torch_threads: int | None,
                 loaded: threading.Event) -> None:
    """The engine process's load and service, once ordered (`helios.server.engine_spawn` runs it);
    `loaded`, set once the ready record is sent, ends the watch for an orphaned load."""
    hold_freed_memory()
    try:
        runtime, body_sha256 = _load(source, options, torch_threads)
        mark("engine: loaded and started")
    except BaseException as error:  # noqa: BLE001 - reported to the serving process
        report_failure(connection, error)
        return
    try:
        from helios.runtime.engine_link import stats_fields
        from helios.server.engine_grammars import EngineGrammars

        model = runtime.model
        stats = stats_fields(runtime.engine.stats.snapshot())
        if not _send_quietly(connection, _Ready(model.tokenizer_json, model.chat_template, stats, body_sha256)):
            return  # the serving process is gone
        loaded.set()
        mark("engine: ready sent")
        freeze_startup_heap()
        grammars = EngineGrammars(model.tokenizer_json, model.prepared.sampled_range[1],
                                  model.settings.eos_token_ids).start()
        try:
            serve_link(connection, runtime.engine, grammars.compile_later)
        finally:
            grammars.close()  # compiles not begun are dropped: the process exits after the running one
    finally:
        runtime.close()


def report_failure(connection, error: BaseException) -> None:
    """Sends the serving process the startup error `error` (as `_portable` makes it), if it is there."""
    _send_quietly(connection, _Failed(_portable(error)))


def _send_quietly(connection, message) -> bool:
    """False where the serving process is gone (it was stopped while this one loaded)."""
    try:
        connection.send(message)
        return True
    except OSError:
        return False


def _load(source: CoreSource, options: RuntimeOptions, torch_threads: int | None):
    """The built runtime and the signed body's digest of the core it loaded (`CoreReplacedError`,
    before anything of it is loaded, where `source` names another)."""
    import torch

    from helios.core.reader import open_core
    from helios.runtime.service import build_runtime

    if torch_threads:
        torch.set_num_threads(torch_threads)
    core = open_core(Path(source.path), accept=source.accept, trusted_keys=[Path(p) for p in source.trusted_keys],
                     aes_key=source.aes_key)
    mark("engine: core verified")
    if source.body_sha256 is not None and core.body_sha256 != source.body_sha256:
        raise _replaced(source, core.body_sha256)
    return build_runtime(core, options), core.body_sha256


def _replaced(source: CoreSource, opened_sha256: bytes) -> CoreReplacedError:
    return CoreReplacedError(
        f"the core file {source.path} changed after the serving process verified it: the engine process "
        f"opened another core (signed body sha256 {opened_sha256.hex()[:16]}..., verified "
        f"{source.body_sha256.hex()[:16]}...); start the server again to serve the file now there")


def _portable(error: BaseException) -> BaseException:
    """A typed error (`HeliosError`, `OSError`) if it survives pickling, else the nearest class of
    its family that does, with its text (so a `HeliosError` keeps its exit code); any other error
    (a fault, not a refusal: its traceback is printed here) an `ExecutionError` with its type and
    text, which the command reports in one line."""
    if isinstance(error, (HeliosError, OSError)) and _pickles(error):
        return error
    if isinstance(error, HeliosError):
        for family in type(error).__mro__[1:]:
            if issubclass(family, HeliosError):
                try:
                    rebuilt = family(str(error))
                except TypeError:  # a family whose constructor takes more than the text
                    continue
                if _pickles(rebuilt):
                    return rebuilt
    if not isinstance(error, (HeliosError, OSError)):
        traceback.print_exception(error, file=sys.stderr)
    return ExecutionError(f"the model failed to load: {type(error).__name__}: {error}")


def _pickles(error: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(error))
        return True
    except Exception:  # noqa: BLE001 - any error that does not pickle
        return False
