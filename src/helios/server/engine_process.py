"""`helios serve`'s model worker in a process of its own (the default; `--no-engine-process` keeps
it a thread of the serving process).

The serving process opens and verifies the core (so trust and usage errors are its own, as
before), then starts the engine process (`multiprocessing`, spawn) with where the core is and how
to load it. The engine process opens the core again, loads it, starts the engine and serves it over
`helios.runtime.engine_link` (grammar matchers compiled again there from their source, against the
same tokenizer); its first message is its readiness (the tokenizer and chat template it loaded, and
its first stats) or its startup error, re-raised here with its type and exit code. The serving
process never loads weights or touches the device.

The engine process ignores SIGINT and SIGTERM: the serving process decides when it stops
(`Shutdown` over the pipe, after the HTTP drain) and it stops by itself when the serving process
is gone. `EngineProcessRuntime` stands where `helios.runtime.service.Runtime` does for
`ServedModel`: `model` (what the frontend reads), `engine` (the link) and `close`.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
from dataclasses import dataclass
from pathlib import Path

from helios.contract import PreparedContract, ResolvedSettings, resolve_settings
from helios.errors import ExecutionError
from helios.runtime.engine_link import EngineLink, serve_link, stats_of, wait_ready
from helios.runtime.service import RuntimeOptions
from helios.runtime.host_heap import hold_freed_memory
from helios.server.heap import freeze_startup_heap

STARTUP_TIMEOUT_S = 3600.0  # a large core on a cold disk loads for minutes


@dataclass(frozen=True)
class CoreSource:
    """How the engine process opens the core the serving process verified."""

    path: str
    accept: str
    trusted_keys: tuple[str, ...]  # public key files or directories
    aes_key: bytes | None = None


@dataclass(frozen=True)
class _Ready:
    tokenizer_json: bytes
    chat_template: str
    stats: tuple


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

    def close(self) -> None:
        """Stops the engine process (idempotent)."""
        self.engine.shutdown()


def start_engine_process(source: CoreSource, prepared: PreparedContract, options: RuntimeOptions,
                         torch_threads: int | None = None,
                         timeout_s: float = STARTUP_TIMEOUT_S) -> EngineProcessRuntime:
    """Starts the engine process and waits until it serves; raises its startup error."""
    context = multiprocessing.get_context("spawn")
    connection, child = context.Pipe()
    process = context.Process(target=_engine_main, args=(child, source, options, torch_threads),
                              name="helios-engine", daemon=False)
    process.start()
    child.close()
    message = wait_ready(connection, timeout_s, process.is_alive)
    if not isinstance(message, _Ready):
        if process.is_alive():
            process.kill()
        process.join(10)
        connection.close()
        if isinstance(message, _Failed):
            raise message.error
        raise ExecutionError(f"the engine process ended while starting (exit code {process.exitcode})")
    view = FrontendView(prepared, resolve_settings(prepared, options.load.startup),
                        message.tokenizer_json, message.chat_template)
    return EngineProcessRuntime(view, EngineLink(connection, process, stats_of(message.stats)))


def _engine_main(connection, source: CoreSource, options: RuntimeOptions, torch_threads: int | None) -> None:
    """The engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hold_freed_memory()
    try:
        runtime, compiler = _load(source, options, torch_threads)
    except BaseException as error:  # noqa: BLE001 - reported to the serving process
        connection.send(_Failed(_portable(error)))
        return
    try:
        from helios.runtime.engine_link import stats_fields
        from helios.runtime.feedback import TensorGrammar

        model = runtime.model
        stats = stats_fields(runtime.engine.stats.snapshot())
        connection.send(_Ready(model.tokenizer_json, model.chat_template, stats))
        freeze_startup_heap()
        serve_link(connection, runtime.engine, lambda text: TensorGrammar(compiler.compile_source(text)))
    finally:
        runtime.close()


def _load(source: CoreSource, options: RuntimeOptions, torch_threads: int | None):
    import torch
    from tokenizers import Tokenizer

    from helios.core.reader import open_core
    from helios.frontend.structured.grammar import GrammarCompiler
    from helios.runtime.service import build_runtime

    if torch_threads:
        torch.set_num_threads(torch_threads)
    core = open_core(Path(source.path), accept=source.accept, trusted_keys=[Path(p) for p in source.trusted_keys],
                     aes_key=source.aes_key)
    runtime = build_runtime(core, options)
    model = runtime.model
    try:
        tokenizer = Tokenizer.from_str(model.tokenizer_json.decode("utf-8"))
        compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=model.prepared.sampled_range[1],
                                                  eos_token_ids=model.settings.eos_token_ids)
    except BaseException:
        runtime.close()
        raise
    return runtime, compiler


def _portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling, else an `ExecutionError` with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any error that does not pickle
        return ExecutionError(f"{type(error).__name__}: {error}")
