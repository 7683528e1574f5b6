"""SIGTERM while a command writes a file unwinds like Ctrl-C, so its writer removes its temporary files.

    with terminate_as_exception():      # around the write; `helios.cli.main` reports `Terminated`
        write_the_file()

The default action of SIGTERM ends the process at once, leaving the temporary file a core (or any
file written beside its final name and renamed into place) is written to: a `kill` of `helios
relocate` left a hidden `.OUT.XXXX.tmp` as large as the core. Inside the block SIGTERM raises
`Terminated` instead; `main` prints one line and exits 143, as the signal would have.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(BaseException):
    """SIGTERM inside `terminate_as_exception`; a BaseException, like KeyboardInterrupt, so that no
    `except Exception` on the way swallows it and the writer's abort removes its temporary files."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def terminate_as_exception():
    """SIGTERM raises `Terminated` inside (the previous handler is restored after). Only the main
    thread can install a handler; elsewhere nothing changes. A SIGTERM the process was started
    ignoring stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return

    def terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
