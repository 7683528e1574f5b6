"""Where rank zero's rendezvous listens and how ranks reach it: only on the address it is given (the
store is unauthenticated; torch's store server, given a host, listened on every interface of the
machine), over IPv6 as over IPv4 (a peer's gloo device took an IPv4 address for an IPv6
rendezvous, and gloo refused to pair the two families when the group formed), with a port written
in ASCII digits, and a port other hosts can know when ranks join from them."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch

from helios.runtime.parallel.rank_peers import RankOptions, UnsupportedRanksError, launch_peers
from helios.runtime.parallel.rank_rendezvous import AddressError, Rendezvous, resolve_address, serve_address
from ignition.hf_checkpoints import QWEN3_MOE

TIMEOUT = timedelta(seconds=30)


def _port(rendezvous: Rendezvous) -> int:
    return int(rendezvous.address.rpartition(":")[2])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def test_a_loopback_rendezvous_listens_on_its_address_only():
    """127.0.0.2 is this machine's loopback too (all of 127/8 is), but not the address given."""
    rendezvous = Rendezvous.serve("127.0.0.1", 0, TIMEOUT)
    port = _port(rendezvous)
    assert _accepts("127.0.0.1", port)
    assert not _accepts("127.0.0.2", port)
    assert not _accepts("::1", port)


def test_an_ipv6_rendezvous_forms_a_group():
    """Rank zero on [::1] and a peer that joins it there form the group and sum over it."""
    zero = Rendezvous.serve("::1", 0, TIMEOUT)
    peer = Rendezvous.join(f"[::1]:{_port(zero)}", TIMEOUT)
    groups, errors = {}, []

    def form(rank: int, rendezvous: Rendezvous) -> None:
        try:
            group = rendezvous.form_group(rank, 2, TIMEOUT)
            total = torch.tensor([rank + 1], dtype=torch.int64)
            group.all_reduce(total)
            groups[rank] = int(total)
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    threads = [threading.Thread(target=form, args=(rank, r), daemon=True) for rank, r in ((0, zero), (1, peer))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert groups == {0: 3, 1: 3}


def test_a_store_that_cannot_start_on_its_socket_is_an_address_error():
    """Under a millisecond the store's own client gives up at once (torch counts whole milliseconds):
    the store's server already owns the socket and closed it, and the error is the rendezvous's."""
    with pytest.raises(AddressError, match="cannot serve the rendezvous"):
        Rendezvous.serve("127.0.0.1", 0, timedelta(microseconds=100))


# '²' passed str.isdigit and then failed int() with a ValueError (a traceback from `helios rank --join`,
# `helios serve --rendezvous`); so did 5,000 digits (past int's 4,300); other scripts' digits were read
# as a port ('٥' as 5).
@pytest.mark.parametrize("port", ["²", "1" * 5000, "٥", "００８０"])
def test_a_port_that_is_not_ascii_digits_is_an_address_error(port):
    with pytest.raises(AddressError, match="is not HOST:PORT"):
        resolve_address(f"127.0.0.1:{port}")
    with pytest.raises(AddressError, match="is not HOST:PORT"):
        serve_address(f"127.0.0.1:{port}")


def test_ranks_from_other_hosts_need_a_rendezvous_port_they_can_know(cores):
    """Port 0 picks a free port that nobody joining from elsewhere can learn: rank zero waited its whole
    join timeout (300 s by default, `helios serve --local-ranks 1` without --rendezvous); now refused at once."""
    options = RankOptions(local_ranks=1, rendezvous="127.0.0.1:0", join_timeout_s=300.0)
    with pytest.raises(UnsupportedRanksError, match="port they cannot know"):
        launch_peers(cores.open(cores.core(QWEN3_MOE, 2)), options, host_pages=0)
