"""A tensor-parallel group that fails, as its operator and clients see it: rank zero's command ends
with one typed line on stderr (no C++ warnings or backtraces of torch beside it); a client whose
request a lost rank ended gets a short typed message while the raw gloo text goes to the server's
log; SIGINT while rank zero forms the group interrupts it at once; and a local rank stopped when
rank zero's process is killed does not stay behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from helios.runtime.parallel.rank_rendezvous import Rendezvous
from helios.runtime.records.events import FinishReason
from ignition.hf_checkpoints import QWEN3_MOE

from .conftest import NAMESPACE, running
from .test_failures import PROCESSES, Requests, lose_a_rank_mid_generation
from .test_generate_cli import free_port

HANG_GUARD_S = 120
LOST = "tensor-parallel model failed: a tensor-parallel rank failed or stopped answering (the server log says why)"


def _rank_zero(cores, command: str, address: str, collective_timeout_s: int = 1) -> subprocess.Popen:
    """`helios generate` / `helios serve` of the two-rank core, waiting for rank 1 on `address`, in
    an environment that does not set torch's C++ log level (this test process may have)."""
    env = {name: value for name, value in os.environ.items() if name != "TORCH_CPP_LOG_LEVEL"}
    extra = (["--prompt-ids", "[[5, 6, 7]]", "--max-tokens", "1"] if command == "generate"
             else ["--port", "0", "--log-level", "warning"])
    return subprocess.Popen(
        [sys.executable, "-m", "helios.cli.main", command, str(cores.core(QWEN3_MOE, 2)), *cores.cli_trust(),
         "--local-ranks", "1", "--rendezvous", address, "--join-timeout", "60",
         "--collective-timeout", str(collective_timeout_s), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _ready_rank_one(address: str) -> Rendezvous:
    """Rank 1 that claims its rank and says it is ready, then never forms the group."""
    rank_one = Rendezvous.join(address, timedelta(seconds=60))
    rank_one.claim(1)
    rank_one.mark_ready(1)
    return rank_one


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_group_that_fails_to_form_ends_rank_zero_with_one_line(cores, command):
    """Rank 1 claims its rank and says it is ready, then never forms the group: rank zero's group
    formation times out (c10d logs warnings about its store socket then) and the command ends with
    its one typed line (exit 8); stderr holds only helios's own lines (the CPU kernels' progress
    line comes first where they were built)."""
    address = f"127.0.0.1:{free_port()}"
    process = _rank_zero(cores, command, address)
    try:
        _ready_rank_one(address)
        _, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        process.kill()
    assert process.returncode == 8, stderr
    lines = stderr.splitlines()
    assert all(line.startswith("helios") for line in lines), stderr
    assert lines[-1].startswith(f"helios {command}: error: rank 0 could not form the group of 2"), stderr


def test_a_lost_rank_gives_clients_a_short_typed_message_and_logs_the_cause(cores, caplog):
    """Rank 1's process is killed mid-generation: the requests it ends and a later one carry the
    short `RankFailure` message, never gloo's text ("[../third_party/gloo/...pair.cc:537] Read
    error ..."); the cause is logged once, at ERROR."""
    caplog.set_level(logging.ERROR, logger="helios.runtime.parallel.ranks")
    with running(cores.open(cores.core(QWEN3_MOE, 2)), PROCESSES) as runtime:
        requests = lose_a_rank_mid_generation(runtime, signal.SIGKILL)
        late = Requests(runtime.engine, 1)
        assert late.all_done.wait(HANG_GUARD_S)
    ended = [event for event in (*requests.finished.values(), *late.finished.values())
             if event.reason is FinishReason.ERROR]
    assert {event.message for event in ended} == {LOST}
    (logged,) = [record for record in caplog.records if record.name == "helios.runtime.parallel.ranks"]
    assert "the tensor-parallel group failed" in logged.getMessage() and "rank" in logged.getMessage()


def test_sigint_while_rank_zero_forms_the_group_ends_it_at_once(cores):
    """SIGINT while rank zero waits in gloo's group formation for a rank that never comes (an hour's
    collective timeout): the command is interrupted (one line, 130) instead of waiting out the
    timeout in native code, where no signal handler ran."""
    address = f"127.0.0.1:{free_port()}"
    process = _rank_zero(cores, "generate", address, collective_timeout_s=3600)
    try:
        rank_one = _ready_rank_one(address)
        while not rank_one.store.check(["helios/form"]):  # rank zero saw every rank ready: it forms the group
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.05)
        time.sleep(1.0)  # inside the formation's wait
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "helios generate: interrupted", stderr


_RANK_ZERO = """
import sys
from helios.core.reader import open_core
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions
from helios.runtime.service import RuntimeOptions, build_runtime
core = open_core(sys.argv[1], accept=sys.argv[2], trusted_keys=[sys.argv[3]])
options = RankOptions(peers=PeerKind.PROCESSES, collective_timeout_s=60.0, join_timeout_s=60.0, torch_threads=1)
runtime = build_runtime(core, RuntimeOptions(ranks=options))
print(*runtime.peers.local_pids, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"  # a zombie: ended, not yet reaped
    except FileNotFoundError:
        return True


def test_a_stopped_local_rank_does_not_outlive_a_killed_rank_zero(cores, tmp_path):
    """Rank 1 is stopped (SIGSTOP) and rank zero's process is then killed (as the serving process kills
    an engine process stuck in a collective with that rank at its shutdown deadline): rank 1 is
    continued when its parent ends and exits, instead of staying behind stopped for ever."""
    log = tmp_path / "rank_zero.log"
    with open(log, "w") as stderr:
        rank_zero = subprocess.Popen([sys.executable, "-c", _RANK_ZERO, str(cores.core(QWEN3_MOE, 2)), NAMESPACE,
                                      str(cores.trust)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True)
    rank_one = None
    try:
        started = rank_zero.stdout.readline()
        assert started, log.read_text()
        (rank_one,) = map(int, started.split())
        os.kill(rank_one, signal.SIGSTOP)
        rank_zero.kill()
        rank_zero.wait()
        deadline = time.monotonic() + HANG_GUARD_S
        while not _is_gone(rank_one):
            assert time.monotonic() < deadline, f"rank 1 (process {rank_one}) outlived rank zero, stopped"
            time.sleep(0.1)
    finally:
        rank_zero.kill()
        if rank_one is not None and not _is_gone(rank_one):
            os.kill(rank_one, signal.SIGKILL)
