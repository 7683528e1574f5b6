"""Remote image fetches (`helios serve --allow-remote-images`) reach public addresses only: a URL
whose host is, or resolves to, a loopback, private, link-local (cloud metadata), unspecified or
reserved address (IPv4-mapped and numeric forms included) is a 400 naming the image part, and no
connection is made (counted on a server listening on 127.0.0.1); a name that resolves to an
internal address, and a redirect to one, are refused the same way; `--allow-internal-image-hosts`
lets the fetch reach them. No network: local servers and a monkeypatched resolver."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import threading

import httpx
import pytest

from helios.frontend.images import decode as decode_module
from helios.frontend.images.decode import ImageLimits, decode_image_url, decode_image_urls
from helios.frontend.images.errors import ImageRejected
from helios.frontend.preparation.image_parts import ImageSource
from helios.server.app import create_app

from .tiny_vl import image_bytes
from .vl_checkpoint import SERVED_ID, served_vl_core

PUBLIC_ONLY = ImageLimits(max_images=2, max_bytes=64 * 1024, allow_remote=True)
INTERNAL_TOO = ImageLimits(max_images=2, max_bytes=64 * 1024, allow_remote=True, allow_internal_hosts=True)
PAYLOAD = image_bytes(30, 20, 4)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    accepted = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.hosts: list[str] = []  # each request's Host header
        self.paths: list[str] = []  # each request's target, as sent

    def get_request(self):
        request = super().get_request()
        self.accepted += 1
        return request


def _handler(redirect_to: str | None = None):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.server.hosts.append(self.headers["Host"])
            self.server.paths.append(self.path)
            if redirect_to is not None:
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args):
            pass

    return Handler


def _start(host: str = "127.0.0.1", redirect_to: str | None = None) -> _Server:
    server = _Server((host, 0), _handler(redirect_to))
    # shutdown() waits for the loop to poll: every 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture()
def local():
    server = _start()
    yield server
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def _public_server(monkeypatch):
    """An image server on 127.0.0.2 that the fetch takes for a public address, every name resolving to
    it: the server and the host names resolved."""
    server = _start("127.0.0.2")
    resolved = []
    original = decode_module._is_internal
    monkeypatch.setattr(decode_module, "_is_internal", lambda ip: ip != "127.0.0.2" and original(ip))
    monkeypatch.setattr(decode_module, "_resolve", lambda host, port: resolved.append(host) or ["127.0.0.2"])
    try:
        yield server, resolved
    finally:
        server.shutdown()
        server.server_close()


def _v6_loopback_listening() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", [
    "127.0.0.1", "localhost", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "[::ffff:127.0.0.1]", "0.0.0.0",
], ids=["ip", "localhost", "decimal", "octal", "hex", "v4-mapped", "unspecified"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_loopback_in_every_form_is_refused_without_a_connection(local, host, scheme):
    port = local.server_address[1]
    url = ImageSource(f"{scheme}://{host}:{port}/cat.png", "messages[0].content[1]")
    with pytest.raises(ImageRejected, match="internal address") as caught:
        decode_image_url(url, PUBLIC_ONLY)
    assert caught.value.param == "messages[0].content[1]"
    assert str(caught.value).startswith("messages[0].content[1]: ")
    assert "--allow-internal-image-hosts" in str(caught.value)
    assert local.accepted == 0


@pytest.mark.parametrize("url", [
    "http://10.1.2.3/cat.png", "http://192.168.0.7:8080/cat.png", "http://172.16.5.5/cat.png",
    "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/cat.png", "http://[fd00::5]/cat.png",
    "http://[::1]/cat.png", "http://[::ffff:169.254.169.254]/x", "http://[::ffff:10.0.0.1]/x",
    "http://100.64.0.1/cat.png", "http://224.0.0.1/cat.png", "http://240.0.0.1/cat.png",
    "http://255.255.255.255/cat.png", "http://[::]/cat.png", "http://[ff02::1]/cat.png",
], ids=["10/8", "192.168/16", "172.16/12", "metadata", "fe80", "fc00/7", "v6-loopback", "v4-mapped-metadata",
        "v4-mapped-10", "cgnat", "multicast", "reserved", "broadcast", "v6-unspecified", "v6-multicast"])
def test_internal_addresses_are_refused_before_connecting(monkeypatch, url):
    connects = []
    monkeypatch.setattr(decode_module.socket, "create_connection", lambda *a, **k: connects.append(a))
    with pytest.raises(ImageRejected, match="internal address"):
        decode_image_urls([url], PUBLIC_ONLY)
    assert connects == []


def test_v6_loopback_is_refused_without_a_connection():
    if not _v6_loopback_listening():  # the refusal itself is covered above with the connection stubbed
        server = None
    else:
        server = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})(("::1", 0), _handler())
    try:
        port = server.server_address[1] if server else 9
        with pytest.raises(ImageRejected, match=r"internal address \(::1"):
            decode_image_urls([f"http://[::1]:{port}/cat.png"], PUBLIC_ONLY)
        assert server is None or server.accepted == 0
    finally:
        if server is not None:
            server.server_close()


def test_a_public_name_resolving_to_a_private_address_is_refused(monkeypatch, local):
    """A name whose resolution is internal (DNS rebinding's second answer) is refused, and the
    connection goes to the checked address: a name that resolves to a public and an internal address
    is refused too."""
    port = local.server_address[1]
    answers = {"images.example.com": ["10.0.0.5"], "mixed.example.com": ["93.184.216.34", "127.0.0.1"]}
    monkeypatch.setattr(decode_module, "_resolve", lambda host, port: answers[host])
    for host in answers:
        with pytest.raises(ImageRejected, match="internal address"):
            decode_image_urls([f"http://{host}:{port}/cat.png"], PUBLIC_ONLY)
    assert local.accepted == 0


def test_the_connection_goes_to_the_checked_address_with_the_original_host_header(monkeypatch):
    """The host is resolved once: the connection is made to the address that was checked, never to a
    second resolution of the name; the request still names the URL's host."""
    with _public_server(monkeypatch) as (server, resolved):
        port = server.server_address[1]
        (decoded,) = decode_image_urls([f"http://cdn.example.com:{port}/cat.png"], PUBLIC_ONLY)
        assert decoded.image.size == (30, 20)
        assert resolved == ["cdn.example.com"] and server.hosts == [f"cdn.example.com:{port}"]
        assert server.accepted == 1


def test_an_internationalized_url_is_sent_as_a_browser_sends_it(monkeypatch):
    """A host name outside ASCII is resolved and named in its IDNA form, and the path's and query's
    spaces and non-ASCII characters are percent-encoded as UTF-8 (urllib sent them raw and the fetch
    failed: "ordinal not in range(256)", "URL can't contain control characters")."""
    with _public_server(monkeypatch) as (server, resolved):
        port = server.server_address[1]
        url = f"http://例え.テスト:{port}/images/café photo.png?size=größer"
        (decoded,) = decode_image_urls([url], PUBLIC_ONLY)
        assert decoded.image.size == (30, 20)
        assert resolved == ["xn--r8jz45g.xn--zckzah"] and server.hosts == [f"xn--r8jz45g.xn--zckzah:{port}"]
        assert server.paths == ["/images/caf%C3%A9%20photo.png?size=gr%C3%B6%C3%9Fer"]
        with pytest.raises(ImageRejected, match="the image URL's host is not a valid domain name"):
            decode_image_urls([f"http://ä..example:{port}/cat.png"], PUBLIC_ONLY)
        assert server.accepted == 1


@pytest.mark.parametrize(("host", "sent"), [("straße.de", "xn--strae-oqa.de"), ("example.com", "example.com")])
def test_a_host_is_sent_to_the_domain_a_browser_reaches(monkeypatch, host, sent):
    """ß is a letter of its own in a host name (IDNA 2008, UTS #46 non-transitional, as browsers read
    it): straße.de is xn--strae-oqa.de. Python's "idna" codec (IDNA 2003) mapped it to "ss" and the
    image was fetched from strasse.de, another domain. An ASCII host is sent as it is."""
    with _public_server(monkeypatch) as (server, resolved):
        port = server.server_address[1]
        (decoded,) = decode_image_urls([f"http://{host}:{port}/straße.png"], PUBLIC_ONLY)
        assert decoded.image.size == (30, 20)
        assert resolved == [sent] and server.hosts == [f"{sent}:{port}"]
        assert server.paths == ["/stra%C3%9Fe.png"]


def test_a_redirect_to_an_internal_address_is_refused(monkeypatch, local):
    """The first hop is "public" (a server on 127.0.0.2 the patched check lets through); its redirect
    to 127.0.0.1 is checked as every hop is, and refused before connecting."""
    target = f"http://127.0.0.1:{local.server_address[1]}/cat.png"
    first = _start("127.0.0.2", redirect_to=target)
    original = decode_module._is_internal
    monkeypatch.setattr(decode_module, "_is_internal", lambda ip: ip != "127.0.0.2" and original(ip))
    try:
        url = ImageSource(f"http://127.0.0.2:{first.server_address[1]}/cat.png", "messages[2].content[0]")
        with pytest.raises(ImageRejected, match="internal address") as caught:
            decode_image_url(url, PUBLIC_ONLY)
        assert caught.value.param == "messages[2].content[0]"
        assert first.accepted == 1 and local.accepted == 0
        # The same redirect is followed when the operator allows internal hosts.
        assert decode_image_url(url, INTERNAL_TOO).image.size == (30, 20)
        assert local.accepted == 1
    finally:
        first.shutdown()
        first.server_close()


def test_internal_hosts_are_fetched_when_the_operator_allows_them(local):
    port = local.server_address[1]
    for host in ("127.0.0.1", "localhost"):
        (decoded,) = decode_image_urls([f"http://{host}:{port}/cat.png"], INTERNAL_TOO)
        assert decoded.image.size == (30, 20)
    assert local.accepted == 2


def test_an_unresolvable_host_is_a_400(monkeypatch):
    def fail(host, port):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(decode_module, "_resolve", fail)
    with pytest.raises(ImageRejected, match="cannot fetch image URL: cannot resolve 'nowhere.invalid'"):
        decode_image_urls(["http://nowhere.invalid/cat.png"], PUBLIC_ONLY)


# --- through the server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_vl_core(tmp_path_factory.getbasetemp(), PUBLIC_ONLY) as served:
        yield create_app(served)


def test_a_metadata_or_loopback_url_is_a_400_naming_the_part(app, local):
    async def post(url: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]
            return await client.post("/v1/chat/completions", json={
                "model": SERVED_ID, "max_tokens": 1, "messages": [{"role": "user", "content": content}]})

    for url in ("http://169.254.169.254/latest/meta-data/", f"http://127.0.0.1:{local.server_address[1]}/cat.png"):
        response = asyncio.run(post(url))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages[0].content[1]", error
        assert "internal address" in error["message"] and "--allow-internal-image-hosts" in error["message"]
    assert local.accepted == 0


# --- the command line ---------------------------------------------------------------------------


def test_allowing_internal_hosts_without_remote_images_is_a_usage_error(capsys):
    from helios.cli.main import main

    try:
        code = main(["serve", "no.core", "--allow-internal-image-hosts"])
    except SystemExit as done:
        code = done.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "--allow-internal-image-hosts" in err and "--allow-remote-images" in err


def test_a_lone_surrogate_in_a_url_is_a_named_refusal():
    """A JSON body's "\\ud800" decodes to a lone surrogate, which has no UTF-8 form: percent-encoding the
    path raised UnicodeEncodeError (a 500) instead of refusing the image."""
    with pytest.raises(ImageRejected, match="lone surrogate"):
        decode_image_urls(["http://cdn.example.com/cat\ud800.png"], PUBLIC_ONLY)
