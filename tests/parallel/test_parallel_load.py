"""Peers load their shards while rank zero loads its own: the launch goes out before rank zero
loads, the page count (rank zero's decision) follows in the sizing, and a rank zero that fails
to load tells its peers why."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from helios.runtime import service
from helios.runtime.loading.model import load_model
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import launch_peers
from helios.runtime.parallel.rank_rendezvous import RankJoinError, Rendezvous, Sizing
from ignition.hf_checkpoints import LLAMA3

from .conftest import FAST, MAX_TOKENS, PROMPTS, running


def test_sizing_round_trips():
    sizing = Sizing(12, ("decode.r2t2", "prefill.r1t16"))
    assert Sizing.decode(sizing.encode()) == sizing


def test_a_peer_has_loaded_its_weights_before_rank_zero_loads(cores, monkeypatch):
    """Rank zero's load waits here until the peer has loaded its programs and weights and asks for
    the sizing: with peers started only after rank zero's load this would never happen."""
    asked = threading.Event()
    read_sizing = Rendezvous.read_sizing

    def recorded(self, timeout):
        asked.set()
        return read_sizing(self, timeout)

    def load_after_the_peer(core, options):
        assert asked.wait(60), "the peer did not load while rank zero waited"
        return load_model(core, options)

    monkeypatch.setattr(Rendezvous, "read_sizing", recorded)
    monkeypatch.setattr(service, "load_model", load_after_the_peer)
    with running(cores.open(cores.core(LLAMA3, 2))) as runtime:
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(LLAMA3)


def test_a_rank_zero_that_fails_to_load_tells_its_peers(cores):
    pending = launch_peers(cores.open(cores.core(LLAMA3, 2)), FAST, host_pages=0)
    peer = pending.peers[0]
    pending.abandon("RuntimeError: out of memory")
    peer.stop(30.0)
    assert isinstance(peer.error, RankJoinError)
    assert "rank zero failed to load: RuntimeError: out of memory" in str(peer.error)
    with pytest.raises(RankJoinError, match="out of memory"):
        pending.rendezvous.read_sizing(timedelta(seconds=1))


def test_a_launch_of_another_version_is_a_typed_refusal():
    rendezvous = Rendezvous.in_process()
    rendezvous.store.set("helios/launch", b'{"identity": {}, "num_pages": 8}')
    with pytest.raises(RankJoinError, match="another helios version"):
        rendezvous.read_launch(timedelta(seconds=1))
