"""`helios serve --host` (`helios.server.serve.bind`): names are resolved, not read for a ':'.

Before, the address family was IPv6 only where the text held a ':', so a name that resolves only to
IPv6 addresses (an IPv6-only host's own name, ``ip6-localhost`` on many systems) was bound as IPv4
and failed ("Name or service not known"). Names resolving to IPv4 (as ``localhost`` here), IPv4 and
IPv6 literals, bracketed or not, bind as before.
"""

from __future__ import annotations

import contextlib
import re
import socket

import pytest

from helios.server.serve import ListenError, bind

V6_ONLY_NAME = "v6-only.helios.test"


@pytest.fixture
def v6_only_name(monkeypatch):
    """A resolver where `V6_ONLY_NAME` has the one address ::1 (as an IPv6-only host's name has)."""
    resolve = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        return resolve("::1" if host == V6_ONLY_NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return V6_ONLY_NAME


def test_a_name_that_resolves_only_to_ipv6_binds_its_address(v6_only_name):
    with contextlib.closing(bind(v6_only_name, 0)) as sock:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"
        port = sock.getsockname()[1]
        sock.listen(1)
        with pytest.raises(ListenError, match=rf"cannot listen on {v6_only_name}:{port}: Address already in use"):
            bind(v6_only_name, port)  # the name shown as given, not in brackets


@pytest.mark.parametrize("host, family, address", [
    ("127.0.0.1", socket.AF_INET, "127.0.0.1"), ("localhost", socket.AF_INET, "127.0.0.1"),
    ("::1", socket.AF_INET6, "::1"), ("[::1]", socket.AF_INET6, "::1"),
])
def test_ipv4_names_and_literals_bind_as_before(host, family, address):
    with contextlib.closing(bind(host, 0)) as sock:
        assert sock.family == family and sock.getsockname()[0] == address


@pytest.mark.parametrize("host, shown", [("no-such-host.invalid", "no-such-host.invalid"), ("[]", "[]"),
                                         ("a" * 300, "a" * 300), ("\x00x", "\x00x"),
                                         ("127.0.0.1:8000", "127.0.0.1:8000"), ("fe80::1%no-such-nic", "[fe80::1%no-such-nic]")])
def test_a_host_that_resolves_to_nothing_is_a_listen_error(host, shown):
    """Never every interface for an empty bracket; a label past DNS's length or a NUL is refused typed;
    an address with its port is not shown in brackets as an IPv6 literal would be."""
    with pytest.raises(ListenError, match=re.escape(f"cannot listen on {shown}:0")):
        bind(host, 0)
