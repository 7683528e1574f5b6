"""The start of `helios serve` once its flags are checked (`helios.cli.serve_cmd`, which may have
started the engine process already): the runtime's options, the verified core, the bound socket,
the loaded model (in the engine process, or in this one) and the server.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import time

import torch

from helios.cli import serve_order
from helios.cli.core_options import open_core_from_args, refuse_core_keys_without_core
from helios.cli.main import printable_line
from helios.cli.runtime_flags import check_startup_flags
from helios.contract import resolve_settings
from helios.core.reader import Core, open_core
from helios.errors import UsageError
from helios.frontend.images.decode import ImageLimits
from helios.runtime.loading.model import resource_of_kind
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.connection_limits import ConnectionLimits
from helios.server.engine_process import CoreSource, start_engine_process
from helios.server.engine_spawn import EngineSpawn
from helios.server.frontend_ahead import FrontendAhead
from helios.server.serve import ServeOptions, bind, serve
from helios.server.start_trace import mark


def run(args: argparse.Namespace, names: tuple[str, ...], spawned: EngineSpawn | None, started: float) -> int:
    """`helios serve` once its flags are checked (`helios.cli.serve_cmd.run`); `names`: the served
    model names; `spawned`: the engine process started ahead (None: the model in this process);
    `started`: when the command started (`time.monotonic()`)."""
    runtime_options = serve_order.runtime_options(args)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    with contextlib.closing(bind(args.host, args.port)) as sock:  # a taken port fails before the load
        runtime, owned_by, ahead = _start(args, runtime_options, spawned, started)
        options = ServeOptions(args.host, args.port, args.queue_capacity, args.frontend_workers,
                               drain_seconds=args.drain_seconds,
                               log_level=args.log_level, access_log=args.access_log,
                               max_body_nbytes=args.max_body_bytes, send_timeout_s=args.send_timeout,
                               api_key=args.api_key, served_names=names, stream_interval=args.stream_interval,
                               image_limits=ImageLimits(args.max_images, args.max_image_bytes,
                                                        args.max_image_pixels, args.allow_remote_images,
                                                        allow_internal_hosts=args.allow_internal_image_hosts),
                               connection_limits=ConnectionLimits(args.max_header_bytes, args.header_timeout,
                                                                  args.body_timeout, args.max_connections),
                               liveness_timeout_s=args.liveness_timeout)
        try:
            return serve(runtime, options, owned_by=owned_by, sock=sock, ahead=ahead)
        finally:
            runtime.close()  # idempotent; stops the ranks also when the server never started




def _open(args: argparse.Namespace) -> tuple[Core, CoreSource]:
    """The verified core, and how an engine process opens it again (that same core: its signed body's
    digest goes with it)."""
    if serve_order.serves_core_file(args):
        if not args.accept:
            raise UsageError("--accept NAMESPACE is required to serve a core file")
        core = open_core_from_args(args, args.core)  # its errors first (the trusted keys, the core)
        return core, dataclasses.replace(serve_order.core_source(args), body_sha256=core.body_sha256)
    refuse_core_keys_without_core(args)  # the embedded model is verified with its own key, and not sealed
    from helios.embedded.prepared import embedded_core

    embedded = embedded_core()
    accept = args.accept or embedded.namespace
    core = open_core(embedded.path, accept=accept, trusted_keys=[embedded.public_key])
    return core, CoreSource(str(embedded.path), accept, (str(embedded.public_key),), None, core.body_sha256)


class _StopSignal(BaseException):
    """SIGTERM, SIGHUP or SIGINT while the server starts (see `_stop_signals_unwind`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_signals_unwind():
    """SIGTERM, SIGHUP and SIGINT (unless ignored) raise `_StopSignal` inside, so a start they
    interrupt unwinds: an engine process still loading (it ignores them) is stopped, not left
    behind. Once serving, uvicorn's handlers take over (`helios.server.serve`).

    SIGINT too, rather than Python's `KeyboardInterrupt`: a KeyboardInterrupt raised at some points
    of an in-process load (native code running Python below it) left CPython's "unhandled
    KeyboardInterrupt" mark set even once `main` caught it, and the interpreter then ended itself by
    SIGINT at exit (status -2, not 130; seen with strace as its own kill). The start raises
    KeyboardInterrupt itself once unwound. Yields the signals received: the unwinding can turn into
    another error on its way out (a cleanup that fails, native code that wraps it), which is the
    stop all the same."""
    received: list[int] = []

    def stop(signum, frame):
        received.append(signum)
        raise _StopSignal(signum)

    caught = [signum for signum in (signal.SIGTERM, signal.SIGHUP)
              if signal.getsignal(signum) is not signal.SIG_IGN]  # as under nohup: stays ignored
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # ignored (a background job): stays so
        caught.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, stop) for signum in caught}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _progress(args: argparse.Namespace, line: str) -> None:
    """A line of the start's progress on stderr, at the info and debug log levels; best effort (a
    stderr nobody reads any more never fails the start)."""
    if args.log_level in ("info", "debug"):
        try:
            print(f"helios serve: {printable_line(line)}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed pipe or file
            pass


def _start(args: argparse.Namespace, runtime_options: RuntimeOptions, spawned: EngineSpawn | None, started: float):
    """The loaded runtime (in an engine process by default), the core's publisher namespace and, with
    an engine process, the frontend's tokenizer and grammar compiler built while it loaded
    (`helios.server.frontend_ahead`; else None). A SIGTERM or SIGHUP meanwhile stops the start (see
    `_stop_signals_unwind`) and then the process, by that signal; a SIGINT stops it with
    `KeyboardInterrupt` (exit 130, in either mode)."""
    received: list[int] = []
    try:
        with _stop_signals_unwind() as received:
            core, source = _open(args)
            check_startup_flags(core.prepared, runtime_options.load.startup)  # before the load, naming the flags
            mark("serve: core verified")
            _progress(args, f"loading {core.path} on {args.device}")
            if spawned is None:
                runtime = build_runtime(core, runtime_options)
                _progress(args, f"loaded, {time.monotonic() - started:.1f} s after the start")
                return runtime, core.publisher.namespace, None
            settings = resolve_settings(core.prepared, runtime_options.load.startup)
            ahead = FrontendAhead(lambda: core.read_resource(resource_of_kind(core, "TOKENIZER")),
                                  core.prepared.sampled_range[1], settings.eos_token_ids)
            runtime = start_engine_process(source, core.prepared, runtime_options, args.torch_threads,
                                           liveness_timeout_s=args.liveness_timeout, spawned=spawned,
                                           while_loading=ahead.start)
            _progress(args, f"loaded, {time.monotonic() - started:.1f} s after the start")
            return runtime, core.publisher.namespace, ahead
    except BaseException as error:
        signum = error.signum if isinstance(error, _StopSignal) else received[0] if received else None
        if signum is None:
            raise
        if signum == signal.SIGINT:
            raise KeyboardInterrupt from None  # here, no native code below: `main` exits 130 with one line
        if spawned is not None:
            spawned.discard()  # not yet ordered or taken over: killed now, not left to notice this process is gone
        print(f"helios serve: stopped by {signal.Signals(signum).name} while starting", file=sys.stderr, flush=True)
        signal.raise_signal(signum)  # its own handler again: the exit a running server's signal gives
        raise
