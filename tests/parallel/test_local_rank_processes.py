"""Rank processes leave nothing behind and say one line: rank zero hands its local rank processes the
keys it trusts through pipes (a directory of key files under the temporary directory was left there
whenever rank zero was killed while its ranks loaded, as `helios serve` kills its engine process on a
stop signal then), and a rank whose rank zero goes away while the group forms ends with its one line
(torch's C++ warning about the failed store call printed a 30-line C++ backtrace before it)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from helios.contract import StartupOptions
from helios.runtime.execution.program_variants import variant_name
from helios.runtime.loading.model import LoadOptions, load_model
from helios.runtime.parallel.rank_peers import RankOptions, launch_peers
from helios.runtime.parallel.rank_rendezvous import Launch, RankIdentity, Rendezvous, Sizing
from ignition.hf_checkpoints import QWEN3_MOE

HANG_GUARD_S = 120  # a rank must be done long before this; reaching it means a hang
_GLOO_ADDRESS_OF_RANK_1 = "helios/group/0/1"  # gloo's key (under the group's prefix) once rank 1 forms the group


def _wait_for(check, process: subprocess.Popen | None, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not check():
        assert process is None or process.poll() is None, f"the rank exited before {what}"
        assert time.monotonic() < deadline, f"no {what} within {HANG_GUARD_S} s"
        time.sleep(0.05)


def test_local_rank_processes_get_their_trust_without_files(cores, tmp_path, monkeypatch):
    """The rank process opens and verifies the core (it claims its rank only after that) with the keys
    rank zero admitted, and nothing was written under the temporary directory for it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    options = RankOptions(collective_timeout_s=5.0, join_timeout_s=60.0, torch_threads=1)
    pending = launch_peers(cores.open(cores.core(QWEN3_MOE, 2)), options, host_pages=0)
    try:
        (peer,) = pending.peers
        _wait_for(lambda: pending.rendezvous.store.check(["helios/claim/1"]), peer.process, "claim of rank 1")
        assert list(scratch.iterdir()) == []
    finally:
        pending.abandon("the test is done")


def test_a_rank_whose_rank_zero_goes_away_while_the_group_forms_says_one_line(cores):
    """Rank zero (its rendezvous, in this process) publishes its launch and sizing, lets the rank load,
    mark itself ready and start forming the group, then goes away: the rank, waiting in gloo's
    connection through the store, ends with exit 8 and its one line on stderr, nothing else."""
    path = cores.core(QWEN3_MOE, 2)
    core = cores.open(path)
    model = load_model(core, LoadOptions(StartupOptions(), "cpu", rank=0, cuda_graphs=False, compile_programs=False))
    rendezvous = Rendezvous.serve("127.0.0.1", 0, timedelta(seconds=60))
    rendezvous.publish(Launch(RankIdentity.of(core.prepared), StartupOptions(), 0, 1, 30.0, join_timeout_s=60.0))
    rendezvous.publish_sizing(Sizing(model.num_pages, tuple(variant_name(p) for p in model.programs)))
    rank = subprocess.Popen([sys.executable, "-m", "helios.cli.rank_cmd", str(path), "--torch-threads", "1",
                             "--join", rendezvous.address, *cores.cli_trust()],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: rendezvous.store.check(["helios/ready/1"]), rank, "ready mark of rank 1")
        assert rendezvous.store.get("helios/ready/1") == b"ok"
        rendezvous.publish_formation()
        _wait_for(lambda: rendezvous.store.check([_GLOO_ADDRESS_OF_RANK_1]), rank, "group formation by rank 1")
        del rendezvous  # the store's only reference: its server closes every connection
        _, err = rank.communicate(timeout=HANG_GUARD_S)
    finally:
        rank.kill()
        rank.wait()
    assert rank.returncode == 8, err
    (line,) = err.splitlines()
    assert line.startswith("helios rank: error: rank 1 could not form the group of 2"), err


_IGNORING_PARENT = """
import os, signal, sys
for signum in (signal.SIGINT, signal.SIGTERM):  # as rank zero's engine process, which starts local ranks
    signal.signal(signum, signal.SIG_IGN)
report = ("import signal, helios.cli.rank_cmd; "
          "print([signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM)])")
os.execv(sys.executable, [sys.executable, "-c", report])
"""


def test_a_rank_process_does_not_keep_the_stop_signals_it_inherits_ignored():
    """Ignored dispositions survive exec: a local rank started by a process that ignores SIGINT and
    SIGTERM ignored them until its handlers were installed, after torch loaded (seconds), so a SIGTERM
    then was lost and the rank went on to load and join. Loading the command restores them."""
    shown = subprocess.run([sys.executable, "-c", _IGNORING_PARENT], capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[True, True]"
