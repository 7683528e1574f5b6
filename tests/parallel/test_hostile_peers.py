"""The rank plane against broken or hostile peers and operator mistakes: a length word that would
allocate without bound, raw sockets at the rendezvous, a rank claimed twice, records of another
version, and `helios rank` given bad options or stopped while it joins. Each ends in a typed
error (one line and a documented exit code for the command), never a hang, a crash or a traceback."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch

from helios.contract import StartupOptions
from helios.runtime.parallel.rank_channel import StepChannel
from helios.runtime.parallel.rank_peers import RankOptions, join_rank
from helios.runtime.parallel.rank_rendezvous import (
    AddressError,
    Launch,
    MissingRankError,
    RankIdentity,
    RankJoinError,
    Rendezvous,
)
from helios.runtime.parallel.rank_timing import PhaseTimers
from helios.runtime.parallel.rank_wire import MessageKind, StepMessage, WireDecoder, WireError, wire_signature
from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import StepPlan
from helios.runtime.records.request import RequestSpec
from ignition.hf_checkpoints import QWEN3_MOE
from support.sweeps import in_sweep

from .conftest import NAMESPACE, running


class _Broadcasts:
    """A stand-in group: `broadcast` writes the given length word and records what was asked."""

    def __init__(self, length: int):
        self.length = length
        self.shapes: list[tuple[int, ...]] = []

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.shapes.append(tuple(tensor.shape))
        if len(self.shapes) == 1:
            tensor[0] = self.length


@pytest.mark.parametrize("length", [2**62, 2**40, -5])
def test_a_broken_length_word_allocates_nothing(length):
    """A peer reads the length word before it sizes the spill buffer: a broken one is a WireError,
    and no second broadcast (and no allocation of `length` words) happens."""
    group = _Broadcasts(length)
    with pytest.raises(WireError, match="message length"):
        StepChannel(group, PhaseTimers()).receive()
    assert group.shapes == [(2048,)]


def _admitting(request_id: str, prompt_tokens: int) -> StepMessage:
    plan = StepPlan(1, 0, Operation.DECODE, None, (), (), 0,
                    (RequestSpec(request_id, tuple(range(prompt_tokens)), 4, frozenset()),))
    return StepMessage(MessageKind.STEP, plan)


def test_a_message_past_the_channel_limit_is_refused_before_it_crosses():
    """Rank zero refuses to send it (that plan fails) and takes no handle for its admissions, so
    its next message still decodes on a peer."""
    group = _Broadcasts(0)
    channel = StepChannel(group, PhaseTimers(), words=16, max_words=64)
    with pytest.raises(WireError, match="longer than the channel"):
        channel.send(_admitting("long", 100))
    assert group.shapes == []
    words = channel._encoder.encode(_admitting("short", 3))
    assert WireDecoder().decode(words).plan.admitted[0].request_id == "short"


def _launch(ranks: int = 2) -> Launch:
    return Launch(RankIdentity(ranks, "cache-identity", "contract-digest", wire_signature()), StartupOptions(), 4, 1,
                  5.0, join_timeout_s=5.0)


@pytest.fixture
def rank_zero():
    """Rank zero's rendezvous on a free loopback port, its launch published."""
    rendezvous = Rendezvous.serve("127.0.0.1", 0, timedelta(seconds=10))
    rendezvous.publish(_launch())
    return rendezvous


def test_raw_clients_at_the_rendezvous_change_nothing_for_a_real_rank(rank_zero):
    """A client that sends nothing, garbage, a huge length prefix after the store's handshake, or
    half a message and goes away: the store refuses each before allocating, and a real rank still
    reads the launch and is seen ready."""
    port = int(rank_zero.address.rpartition(":")[2])
    handshake = b"\0" + struct.pack("<I", 0x3C85F7CE)  # the store's validation message
    hostile = [b"", b"\xff" * 64, b"GET / HTTP/1.1\r\n\r\n", handshake + b"\x01" + struct.pack("<Q", 2**62)]
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in hostile]
    try:
        for connection, data in zip(sockets, hostile):
            connection.sendall(data)
        with socket.create_connection(("127.0.0.1", port)) as truncated:
            truncated.sendall(handshake[:3])
        peer = Rendezvous.join(rank_zero.address, timedelta(seconds=10))
        assert peer.read_launch(timedelta(seconds=10)) == _launch()
        peer.claim(1)
        peer.mark_ready(1)
        rank_zero.wait_ready(range(1, 2), 10.0, lambda: None)
    finally:
        for connection in sockets:
            connection.close()


def test_a_rank_claimed_twice_is_refused_to_the_second_claimant_before_it_loads():
    rendezvous = Rendezvous.in_process()
    rendezvous.publish(_launch())
    rendezvous.claim(1)
    with pytest.raises(RankJoinError, match="rank 1 is already taken"):
        join_rank(None, rendezvous, 1)  # no core: refused before anything of it is read
    with pytest.raises(RankJoinError, match="not a peer rank"):
        join_rank(None, rendezvous, 2)


class _BrokenCore:
    @property
    def prepared(self):
        raise RuntimeError("the disk went away")


def test_a_rank_that_fails_to_load_for_any_reason_tells_rank_zero_why():
    """Not only a `LoadError`: rank zero hears the refusal at once instead of at its join timeout."""
    rendezvous = Rendezvous.in_process()
    rendezvous.publish(_launch())
    with pytest.raises(RuntimeError, match="disk"):
        join_rank(_BrokenCore(), rendezvous, 1)
    with pytest.raises(RankJoinError, match="rank 1 refused to join: RuntimeError: the disk went away"):
        rendezvous.wait_ready(range(1, 2), 30.0, lambda: None)


def test_records_rank_zero_cannot_read_are_refused():
    rendezvous = Rendezvous.in_process()
    rendezvous.store.set("helios/ready/1", b"yes")  # neither ready nor a refusal
    with pytest.raises(RankJoinError, match="neither ready nor a refusal"):
        rendezvous.wait_ready(range(1, 2), 30.0, lambda: None)
    rendezvous.store.set("helios/sizing", b"\xff{not json")
    with pytest.raises(RankJoinError, match="cannot read"):
        rendezvous.read_sizing(timedelta(seconds=1))
    rendezvous.store.set("helios/launch", b'{"identity": []}')
    with pytest.raises(RankJoinError, match="another helios version"):
        rendezvous.read_launch(timedelta(seconds=1))


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", ":80", "nosuchhost.invalid:80"])
def test_a_bad_rendezvous_address_is_refused_at_once(address):
    with pytest.raises(AddressError, match="HOST:PORT|does not resolve"):
        Rendezvous.join(address, timedelta(seconds=30))


def test_joining_a_listener_that_never_answers_ends_at_the_timeout():
    """A rank zero that accepts but never speaks (the rank's side of a slowloris) holds a joiner
    only for its timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(MissingRankError, match="accepted the connection but never answered"):
            Rendezvous.join(f"127.0.0.1:{listener.getsockname()[1]}", timedelta(seconds=1))


def test_a_joiner_whose_rank_zero_went_away_gets_a_missing_rank_error():
    """Rank zero's store gone (its process died) after a peer read the launch: taking a rank number
    and claiming it are a `MissingRankError` (`helios rank` exits 8: rank zero is gone), not the
    store's own DistNetworkError (exit 1, with torch's text), as every other call of a joiner."""
    zero = Rendezvous.serve("127.0.0.1", 0, timedelta(seconds=10))
    zero.publish(_launch())
    peer = Rendezvous.join(zero.address, timedelta(seconds=10))
    assert peer.read_launch(timedelta(seconds=10)) == _launch()
    del zero  # the store's only reference: its server closes every connection
    for take in (lambda: peer.next_remote_rank(1), lambda: peer.claim(1)):
        with pytest.raises(MissingRankError, match="rank zero at .* went away"):
            take()


_STORE_SERVER = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
print(store.port, flush=True)
time.sleep(120)
"""


def test_a_joiner_whose_rank_zero_stops_answering_gives_up_at_its_timeout():
    """Rank zero stopped (SIGSTOP) while a peer waits for its launch: the store's client would
    block for ever in that call, whatever its timeout; the peer ends with `MissingRankError`."""
    server = subprocess.Popen([sys.executable, "-c", _STORE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        address = f"127.0.0.1:{int(server.stdout.readline())}"
        peer = Rendezvous.join(address, timedelta(seconds=1))
        server.send_signal(signal.SIGSTOP)
        with pytest.raises(MissingRankError, match="stopped answering|published no launch"):
            peer.read_launch(timedelta(seconds=1))
    finally:
        server.kill()
        server.wait()


# `helios rank`: operator mistakes, stop signals and a rank zero that goes away.

HANG_GUARD_S = 120  # a rank must be done long before this; reaching it means a hang


@pytest.mark.parametrize("options, says", [
    (["--join", "127.0.0.1"], "HOST:PORT"),
    (["--join", "127.0.0.1:0"], "port 1..65535"),
    (["--join", "127.0.0.1:99999"], "port 1..65535"),
    (["--join", "nosuchhost.invalid:5000"], "does not resolve"),
    (["--join", "127.0.0.1:5000", "--rank", "-1"], "--rank"),
    (["--join", "127.0.0.1:5000", "--device", "nosuchdevice"], "cpu or cuda"),
    (["--join", "127.0.0.1:5000", "--device", "cuda:-1"], "cpu or cuda"),
    (["--join", "127.0.0.1:5000", "--torch-threads", "-2"], "--torch-threads"),
    (["--join", "127.0.0.1:5000", "--join-timeout", "nan"], "--join-timeout"),
    (["--join", "127.0.0.1:5000", "--join-timeout", "inf"], "--join-timeout"),
])
def test_rank_options_are_checked_before_anything_else(options, says, capsys, tmp_path):
    """Exit 2 and one line, before the core is opened (none exists here) or rank zero is asked."""
    from helios.cli.rank_cmd import run_alone

    code = run_alone([str(tmp_path / "missing.core"), *options, "--accept", "ns", "--trust", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("helios rank: error:") and says in err


def _rank(core, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "helios.cli.rank_cmd", str(core), "--torch-threads", "1",
                             *options], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _ended(process: subprocess.Popen) -> tuple[int, list[str]]:
    """Exit status and stderr lines of a rank process (killed if it outlives the hang guard)."""
    try:
        _, err = process.communicate(timeout=HANG_GUARD_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in err, err
    return process.returncode, [line for line in err.splitlines() if line.startswith("helios rank:")]


# SIGINT (130) only with HELIOS_RANK_FAILURE_SWEEP=1: rank_cmd's one stop handler ends the rank for it as for
# SIGTERM (143), which the suite sends here while joining and while serving (test_a_stop_signal_while_serving...).
STOPS = in_sweep("HELIOS_RANK_FAILURE_SWEEP", (pytest.param(signal.SIGTERM, 143, id="sigterm"),),
                 (pytest.param(signal.SIGINT, 130, id="sigint"),))


@pytest.mark.parametrize("how, code", STOPS)
def test_a_stop_signal_while_joining_ends_the_rank_with_one_line(cores, how, code):
    """The rank blocks in the store's connection to a listener that never answers; the signal
    still ends it at once, with its line and status."""
    core = cores.core(QWEN3_MOE, 2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(HANG_GUARD_S)
        rank = _rank(core, "--join", f"127.0.0.1:{listener.getsockname()[1]}", "--join-timeout", "600",
                     *cores.cli_trust())
        accepted = [listener.accept()[0] for _ in range(2)]  # the reachability probe, then the store's
        rank.send_signal(how)
        status, lines = _ended(rank)
        for connection in accepted:
            connection.close()
    assert status == code
    assert lines == [f"helios rank: stopped by {how.name}"]


def _rank_outcome(core, *options: str) -> tuple[int, str]:
    """The exit status and line `helios rank` ends with (its worker's outcome, run in this process:
    the process's exit with them is test_a_rank_whose_rank_zero_dies_exits_with_its_status's)."""
    import argparse

    from helios.cli import rank_cmd

    parser = argparse.ArgumentParser(prog="helios")
    rank_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rank", str(core), *options])
    rank_cmd._check_options(args)
    outcome: list = []
    rank_cmd._serve(args, outcome)
    (result,) = outcome
    return result


def test_a_core_for_one_rank_or_signed_by_an_untrusted_key_is_one_line(cores, tmp_path):
    status, line = _rank_outcome(cores.core(QWEN3_MOE, 1), "--join", "127.0.0.1:9", "--join-timeout", "1",
                                 *cores.cli_trust())
    assert status == 8 and "\n" not in line and "prepared for one rank" in line
    stranger = tmp_path / "stranger.key"
    from helios.cli.main import main

    assert main(["keygen", "-o", str(stranger)]) == 0
    status, line = _rank_outcome(cores.core(QWEN3_MOE, 2), "--join", "127.0.0.1:9", "--accept", NAMESPACE, "--trust",
                                 f"{stranger}.pub")
    assert status == 6 and "\n" not in line and "no trusted key" in line


_RANK_ZERO = """
import sys, time
from pathlib import Path
from helios.core.reader import open_core
from helios.runtime.parallel.rank_peers import RankOptions
from helios.runtime.service import RuntimeOptions, build_runtime

path, namespace, trust, address = sys.argv[1:]
core = open_core(Path(path), accept=namespace, trusted_keys=[Path(trust)])
# rank zero with rank 1 joining over loopback, then idle
options = RankOptions(local_ranks=1, rendezvous=address, join_timeout_s=60.0, collective_timeout_s=3.0)
runtime = build_runtime(core, RuntimeOptions(ranks=options))
print("ready", flush=True)
time.sleep(300)
"""


def _rank_zero_gone_while_loading(cores, core, address: str) -> tuple[int, list[str]]:
    """The end of a rank whose rank zero (its rendezvous alone, in this process: no process of its
    own to start) goes away once the rank has claimed its rank, while it loads: the store's last
    reference dropped, its server closes every connection as a killed process's would."""
    host, _, port = address.rpartition(":")
    rendezvous = Rendezvous.serve(host, int(port), timedelta(seconds=60))
    rendezvous.publish(Launch(RankIdentity.of(cores.open(core).prepared), StartupOptions(), 0, 1, 3.0,
                              join_timeout_s=60.0))
    rank = _rank(core, "--join", address, "--join-timeout", "60", *cores.cli_trust())
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not rendezvous.store.check(["helios/claim/1"]):
            assert rank.poll() is None and time.monotonic() < deadline, "rank 1 never claimed its rank"
            time.sleep(0.05)
        del rendezvous  # the store's only reference: its server stops
        return _ended(rank)
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.parametrize("when, code, says", [("serving", 9, "the group broke"),
                                              ("loading", 8, "rank zero at")], ids=["serving", "loading"])
def test_a_rank_whose_rank_zero_dies_exits_with_its_status(cores, when, code, says):
    """Rank zero killed while the rank serves (the group broke: 9) or while it loads (it could
    not join: 8): one line each, no traceback, and the rank's process is gone."""
    from .test_generate_cli import free_port

    core, address = cores.core(QWEN3_MOE, 2), f"127.0.0.1:{free_port()}"
    if when == "loading":
        status, lines = _rank_zero_gone_while_loading(cores, core, address)
    else:
        zero = subprocess.Popen([sys.executable, "-c", _RANK_ZERO, str(core), NAMESPACE, str(cores.trust), address],
                                stdout=subprocess.PIPE, text=True)
        try:
            rank = _rank(core, "--join", address, "--join-timeout", "60", *cores.cli_trust())
            assert zero.stdout.readline() == "ready\n"
            zero.kill()
            status, lines = _ended(rank)
        finally:
            zero.kill()
            zero.wait()
    assert status == code, lines
    *before, last = lines
    assert all(line.startswith("helios rank: serving rank 1 of 2") for line in before) and len(before) <= 1, lines
    assert last.startswith("helios rank: error:") and says in last, lines


@pytest.mark.parametrize("options, says", [
    (["--rendezvous", "127.0.0.1:99999"], "port 0..65535"),
    (["--rendezvous", "nosuchhost.invalid:0"], "cannot serve the rendezvous"),
    (["--rendezvous", "192.0.2.1:0"], "cannot serve the rendezvous"),  # TEST-NET-1: not this machine's
    (["--join-timeout", "nan"], "--join-timeout"),
    (["--collective-timeout", "inf"], "--collective-timeout"),
])
def test_rank_options_of_serve_and_generate_are_usage_errors(options, says):
    """Refused while the options are read (exit 2), not by the store after its timeout or with a
    traceback (a port past 65535, a NaN timeout)."""
    import argparse

    from helios.cli.rank_options import add_rank_options, rank_options_from_args
    from helios.errors import UsageError

    parser = argparse.ArgumentParser()
    add_rank_options(parser)
    with pytest.raises(UsageError, match=says):
        rank_options_from_args(parser.parse_args(options))


def test_a_taken_rendezvous_port_is_an_address_error(rank_zero):
    port = int(rank_zero.address.rpartition(":")[2])
    with pytest.raises(AddressError, match="cannot serve the rendezvous"):
        Rendezvous.serve("127.0.0.1", port, timedelta(seconds=5))


def test_a_peer_refusal_is_read_up_to_a_bound():
    rendezvous = Rendezvous.in_process()
    rendezvous.store.set("helios/ready/1", b"reject:" + b"x" * 1_000_000)
    with pytest.raises(RankJoinError) as refused:
        rendezvous.wait_ready(range(1, 2), 30.0, lambda: None)
    assert len(str(refused.value)) < 5000


@pytest.mark.parametrize("field, value", [("collective_timeout_s", float("nan")), ("join_timeout_s", -1.0),
                                          ("collective_timeout_s", "60"), ("first_remote_rank", 7),
                                          ("host_pages", -3), ("backend", "mpi"), ("cuda_graphs", "yes")])
def test_a_launch_with_values_no_rank_zero_publishes_is_refused(field, value):
    """Read from the store, a launch must hold what this version's rank zero publishes; a NaN
    timeout ended a joiner with a ValueError traceback when it formed the group."""
    import json

    rendezvous = Rendezvous.in_process()
    fields = json.loads(_launch().encode())
    fields[field] = value
    rendezvous.store.set("helios/launch", json.dumps(fields).encode())
    with pytest.raises(RankJoinError, match="another helios version"):
        rendezvous.read_launch(timedelta(seconds=1))


def test_a_sizing_with_values_of_the_wrong_kind_is_refused():
    rendezvous = Rendezvous.in_process()
    rendezvous.store.set("helios/sizing", b'{"num_pages": -1, "variants": [], "error": ""}')
    with pytest.raises(RankJoinError, match="cannot read"):
        rendezvous.read_sizing(timedelta(seconds=1))


def test_the_exit_line_is_one_line_whatever_the_error_holds(monkeypatch, capsys):
    from helios.cli import rank_cmd

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(rank_cmd.os, "_exit", exit_)
    with pytest.raises(SystemExit) as ended:
        rank_cmd._exit_now(9, "error: the group broke:\n  gloo said\n\nthis")
    assert ended.value.code == 9
    assert capsys.readouterr().err == "helios rank: error: the group broke: | gloo said | this\n"


def test_a_stop_signal_while_serving_ends_the_rank_with_one_line(cores):
    """The rank waits for rank zero's next message inside a gloo collective; SIGTERM still ends
    it at once (143, one line), not when the collective returns. Rank zero is this process (its
    rendezvous on loopback, then idle): only the rank needs a process of its own here."""
    from .test_generate_cli import free_port

    core, address = cores.core(QWEN3_MOE, 2), f"127.0.0.1:{free_port()}"
    rank = _rank(core, "--join", address, "--join-timeout", "60", *cores.cli_trust())
    try:
        options = RankOptions(local_ranks=1, rendezvous=address, join_timeout_s=60.0, collective_timeout_s=3.0)
        with running(cores.open(core), options):  # returns once rank 1 joined and serves
            rank.send_signal(signal.SIGTERM)
            status, lines = _ended(rank)
    finally:
        rank.kill()
        rank.wait()
    assert status == 143, lines
    assert lines[-1] == "helios rank: stopped by SIGTERM" and len(lines) <= 2, lines


def test_a_rank_line_is_one_write(monkeypatch):
    """The worker's "serving" line and a stop signal's line (printed by the main thread) are two
    writers of stderr: each line goes out in one write, or the signal's line can land between the
    other's text and its newline."""
    from helios.cli import rank_cmd

    class Stderr:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    stderr = Stderr()
    monkeypatch.setattr(rank_cmd.sys, "stderr", stderr)
    rank_cmd._say("serving rank 1 of 2 for 127.0.0.1:1")
    assert stderr.writes == ["helios rank: serving rank 1 of 2 for 127.0.0.1:1\n"]
