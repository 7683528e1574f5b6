"""`helios serve [MODEL.core] --accept NS --trust KEY.pub [--host --port ...]`: the HTTP server.

With a core file, `--accept` (and trusted keys, as on every command that loads a core) are
required. Without one, the embedded default model is served (prepared into the cache on first use
and signed with a local key; see `helios.embedded.prepared`).

This module imports neither torch nor the serving stack: once the flags are checked, `run` starts
the engine process (`helios.server.engine_spawn`), and only then imports the rest of the start
(`helios.cli.serve_run`), so the two processes' imports run side by side.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from helios.cli import serve_order
from helios.cli.core_options import TRUST_ENV
from helios.cli.rank_options import add_rank_options
from helios.cli.runtime_flags import add_runtime_flags
from helios.cli.stack_dumps import dump_stacks_on_sigusr1
from helios.core.layout import MAGIC
from helios.errors import UsageError
from helios.runtime.stall_watch import DEFAULT_LIVENESS_TIMEOUT_S
from helios.server.access import API_KEY_ENV
from helios.server.defaults import (
    DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEAD_TIMEOUT_S, DEFAULT_MAX_BODY_NBYTES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_HEAD_NBYTES, DEFAULT_MAX_IMAGE_NBYTES, DEFAULT_MAX_IMAGES, DEFAULT_SEND_TIMEOUT_S, DRAIN_SECONDS,
    default_max_body_nbytes,
)
from helios.server.engine_spawn import ArgsOrder, spawn_engine_process
from helios.server.start_trace import mark

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_THREADS = 1024  # --frontend-workers, --torch-threads: far past any use, short of what a process can start
MAX_COUNT = 2**31 - 1  # the other counts and byte sizes: past any use, within what sockets and torch take
MAX_SECONDS = 365 * 24 * 3600  # timeouts: a year is "never"; larger ones overflow the timers of threads
_SECONDS = ("send_timeout", "header_timeout", "body_timeout", "liveness_timeout", "drain_seconds")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a core over an OpenAI-compatible HTTP API",
        description="Load a verified core and serve /v1/chat/completions, /v1/completions, /v1/models, "
        "/health and /metrics. Without MODEL.core the embedded default model is served. SIGTERM or "
        "SIGINT stops accepting, drains connections for --drain-seconds (default "
        f"{DRAIN_SECONDS}), then stops the model.",
    )
    parser.add_argument("core", nargs="?", metavar="MODEL.core", help="core file (default: the embedded default model)")
    parser.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                        help="address to listen on: a host name or an IPv4 or IPv6 literal, bare or in brackets "
                        "(::1 or [::1]; 0.0.0.0 or :: for every interface; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, metavar="PORT", help="TCP port; 0 picks a free one (default 8000)")
    parser.add_argument("--max-active", type=int, metavar="N", help="requests generating at once (default: the core's concurrency)")
    parser.add_argument("--queue-capacity", type=int, default=256, metavar="N",
                        help="requests waiting for a slot; admission allows max-active + this (default 256)")
    parser.add_argument("--frontend-workers", type=int, default=min(4, os.cpu_count() or 1), metavar="N",
                        help="concurrent request preparations (template, tokenize, grammar; default min(4, CPUs))")
    parser.add_argument("--context-tokens", type=int, metavar="N", help="largest prompt+output per request (default: the core's)")
    parser.add_argument("--device", default="cpu", metavar="DEVICE", help="torch device of the model: cpu (default), cuda or cuda:N")
    parser.add_argument("--torch-threads", type=int, metavar="N", help="intra-op threads of the model worker (default: torch's)")
    parser.add_argument("--max-body-bytes", type=int, metavar="BYTES",
                        help="largest request body; larger ones get 413 naming this flag (default: "
                        f"{DEFAULT_MAX_BODY_NBYTES} plus, serving a core file, room for --max-images images of "
                        "--max-image-bytes each as base64 data: URLs: "
                        f"{default_max_body_nbytes(DEFAULT_MAX_IMAGES, DEFAULT_MAX_IMAGE_NBYTES)} at the image "
                        f"defaults; the embedded model takes no images: {DEFAULT_MAX_BODY_NBYTES})")
    parser.add_argument("--send-timeout", type=float, default=DEFAULT_SEND_TIMEOUT_S, metavar="SECONDS",
                        help="seconds a response write may wait for a client that stopped reading before the "
                        f"response is dropped and its admission permit released (default {DEFAULT_SEND_TIMEOUT_S:.0f})")
    parser.add_argument("--drain-seconds", type=float, default=DRAIN_SECONDS, metavar="SECONDS",
                        help="after SIGTERM, SIGHUP or SIGINT: seconds open responses may run on before each "
                        "still running ends with an error event and its connection closes; then the model "
                        f"stops (default {DRAIN_SECONDS})")
    parser.add_argument("--stream-interval", type=int, default=1, metavar="N",
                        help="streamed responses: after the first token, write N tokens' output at a time "
                        "(default 1: every token as it comes; larger N: fewer, larger writes for up to "
                        "N - 1 tokens of added latency)")
    connections = parser.add_argument_group("connections (what a client may hold before its request is admitted)")
    connections.add_argument("--max-header-bytes", type=int, default=DEFAULT_MAX_HEAD_NBYTES, metavar="BYTES",
                             help="largest request line plus header block; a larger one gets 431 and the "
                             f"connection is closed, before more is buffered (default {DEFAULT_MAX_HEAD_NBYTES})")
    connections.add_argument("--header-timeout", type=float, default=DEFAULT_HEAD_TIMEOUT_S, metavar="SECONDS",
                             help="seconds from a connection's accept (or, kept alive, its next request's first "
                             "byte) to the end of the request's headers; later: 408 and closed, or closed if "
                             f"nothing was sent (default {DEFAULT_HEAD_TIMEOUT_S:.0f})")
    connections.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S, metavar="SECONDS",
                             help="seconds from the start of a request's handling (the end of its headers, or "
                             "for a pipelined request the end of the response before it) to the end of its "
                             f"body; later: 408 and the connection closed (default {DEFAULT_BODY_TIMEOUT_S:.0f})")
    connections.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                             help="open connections at once; one more gets 503 and is closed, the refusals "
                             "logged at most every 10 s; the open-file limit is raised to fit, or the cap "
                             f"lowered, logged (default {DEFAULT_MAX_CONNECTIONS})")
    images = parser.add_argument_group("images (vision-language cores)")
    images.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help=f"images per request (default {DEFAULT_MAX_IMAGES}; the default --max-body-bytes "
                        "makes room for them)")
    images.add_argument("--max-image-bytes", type=int, default=DEFAULT_MAX_IMAGE_NBYTES, metavar="BYTES",
                        help="encoded bytes per image (default 2 MiB; the default --max-body-bytes makes room for "
                        "--max-images of them as base64, a --max-body-bytes given applies as it is)")
    images.add_argument("--max-image-pixels", type=int, default=4096 * 4096, metavar="PIXELS",
                        help="decoded pixels per image (default 4096x4096)")
    images.add_argument("--allow-remote-images", action="store_true",
                        help="fetch http(s) image URLs (default: only data: URLs; remote URLs are a 400)")
    images.add_argument("--allow-internal-image-hosts", action="store_true",
                        help="fetch remote images from loopback, private and link-local addresses too; only "
                        "with --allow-remote-images")
    parser.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                        help="run the model worker in a process of its own, beside the HTTP server's "
                        "(default on; off: a thread of the server's process)")
    parser.add_argument("--liveness-timeout", type=float, default=DEFAULT_LIVENESS_TIMEOUT_S, metavar="SECONDS",
                        help="seconds without a heartbeat from the engine process (sent every second) after which "
                        "/health answers 503 unresponsive, or with requests pending and no model-worker step "
                        "completed after which it answers 503 stalled (200 again once heartbeats resume or a step "
                        "completes; nothing is killed), far past a long prefill or grammar compile "
                        f"(default {DEFAULT_LIVENESS_TIMEOUT_S:.0f})")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="server log level (default info)")
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                        help="one line per HTTP request: status, tokens, latency (default on)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on /v1/ requests, else 401 (default: ${API_KEY_ENV})")
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME",
                        help="names the model is served under, the first reported in responses "
                        "(default: the core's served id and aliases)")
    add_runtime_flags(parser)
    group = parser.add_argument_group("trust")
    group.add_argument("--accept", metavar="NAMESPACE",
                       help="accept the publisher's terms; must equal the core's signed publisher namespace "
                       "(required with MODEL.core)")
    group.add_argument("--trust", action="append", metavar="KEY.pub|DIR",
                       help=f"trusted public key file or directory of *.pub files (repeatable; default: ${TRUST_ENV})")
    group.add_argument("--aes-key", metavar="FILE", help="AES-256 key file for version 4 logical-resource cores")
    add_rank_options(parser)
    parser.set_defaults(func=run)


def default_body_limit(args: argparse.Namespace) -> int:
    """The body limit without --max-body-bytes (its help says it): a core file may be a vision
    core, whose requests carry up to --max-images base64 images of --max-image-bytes beside their
    text; the embedded model takes no images."""
    if not serve_order.serves_core_file(args):
        return DEFAULT_MAX_BODY_NBYTES
    return min(MAX_COUNT, default_max_body_nbytes(args.max_images, args.max_image_bytes))


def _is_core_file(name: str) -> bool:
    """Whether a --served-model-name is a core file's path: named .core, or a file that starts as one."""
    if name.endswith(".core"):
        return True
    try:
        if not os.path.isfile(name):  # first: opening a FIFO would wait for a writer
            return False
        with open(name, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except (OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    mark("serve: command line read")
    dump_stacks_on_sigusr1()
    for name in ("max_active", "queue_capacity", "frontend_workers", "context_tokens", "torch_threads",
                 "max_body_bytes", "send_timeout", "max_images", "max_image_bytes", "max_image_pixels",
                 "stream_interval", "max_header_bytes", "header_timeout", "body_timeout", "max_connections",
                 "liveness_timeout", "drain_seconds"):
        value = getattr(args, name)
        if value is not None and not 0 < value < math.inf:  # nan and inf too: timers cannot take them
            raise UsageError(f"--{name.replace('_', '-')} must be positive and finite")
        limit = MAX_THREADS if name in ("frontend_workers", "torch_threads") else (
            MAX_SECONDS if name in _SECONDS else MAX_COUNT)
        if value is not None and value > limit:
            raise UsageError(f"--{name.replace('_', '-')} must be at most {limit}")
    if args.max_body_bytes is None:
        args.max_body_bytes = default_body_limit(args)
    names = tuple(args.served_model_name or ())
    if any(not name.strip() for name in names) or len(set(names)) != len(names):
        raise UsageError("--served-model-name takes distinct, nonempty names")
    if any(not name.isprintable() or not _is_utf8(name) for name in names):  # /metrics and responses could not carry it
        raise UsageError("--served-model-name takes printable UTF-8 names")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError(f"--api-key (or ${API_KEY_ENV}) must not be empty")
    if args.api_key is not None and not args.api_key.isprintable():  # no header could carry it: every request a 401
        raise UsageError(f"--api-key (or ${API_KEY_ENV}) holds control characters")
    if args.api_key is not None and args.api_key != args.api_key.strip():  # HTTP parsers strip a header's ends
        raise UsageError(f"--api-key (or ${API_KEY_ENV}) starts or ends with whitespace, which no request can send")
    if not args.host.strip():  # the socket would listen on every interface: say so with 0.0.0.0 or ::
        raise UsageError("--host must not be empty (0.0.0.0 or :: listens on every interface)")
    if args.core is None and any(_is_core_file(name) for name in names):
        raise UsageError("--served-model-name took the core file as a name: put MODEL.core before the option, "
                         "or end the names with --")
    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be in [0, 65535]")
    if args.allow_internal_image_hosts and not args.allow_remote_images:
        raise UsageError("--allow-internal-image-hosts is only meaningful with --allow-remote-images")
    spawned = spawn_engine_process(device=args.device) if args.engine_process else None  # its imports run beside ours
    mark("serve: engine process started")
    try:
        if spawned is not None and serve_order.serves_core_file(args):  # it loads beside our imports
            spawned.order_ahead(ArgsOrder(serve_order.engine_order, serve_order.load_flags(args)))
            mark("serve: load ordered ahead")
        from helios.cli import serve_run  # torch, the runtime and the HTTP stack

        mark("serve: serving stack imported")

        return serve_run.run(args, names, spawned, started)
    finally:
        if spawned is not None:
            spawned.discard()  # the start failed before it ordered or took over the engine process


def _is_utf8(text: str) -> bool:
    """Whether `text` encodes to UTF-8 (a command-line argument of bytes that are not UTF-8 arrives
    with lone surrogates, which no response or /metrics scrape can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
