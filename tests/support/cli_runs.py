"""`helios` commands run in process through `main`, as the command-line tests read them."""

from __future__ import annotations

import contextlib
import resource
import signal

from helios.cli.main import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of `helios ARGV`; no traceback may reach stderr."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as done:  # argparse's own usage errors
        code = done.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_line(err: str) -> str:
    """`err`, which must be exactly one line."""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err


@contextlib.contextmanager
def disk_full_past(nbytes: int):
    """Writes past `nbytes` of a file fail with EFBIG inside (RLIMIT_FSIZE, SIGXFSZ ignored): a full
    disk, for the process's own writes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
