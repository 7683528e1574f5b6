"""Bounds of remote image fetches (`helios serve --allow-remote-images`) beyond the host checks of
`test_remote_image_hosts`: the fetches of one request share one deadline (`FETCH_DEADLINE_S` in
all, not per image), a URL with credentials is refused by name before any connection (it was taken
as part of the host name and the password quoted back), as is one whose port is out of range (a
500, or a port wrapped around), and 6to4 and site-local IPv6 addresses are internal ones. No
network: local servers, a stubbed resolver and connection, a fake clock and a stub fetch."""

from __future__ import annotations

import http.server
import threading
from types import SimpleNamespace

import pytest

from helios.frontend.images import decode as decode_module
from helios.frontend.images.decode import ImageLimits, decode_image_url, decode_image_urls
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import LayoutParams
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.images.preparation import PreparationParams
from helios.frontend.preparation.image_parts import ImageSource

from .tiny_vl import MAX_PIXELS, MEAN, MIN_PIXELS, STD, image_bytes

PAYLOAD = image_bytes(30, 20, 4)
PUBLIC_ONLY = ImageLimits(max_images=4, max_bytes=64 * 1024, allow_remote=True)
INTERNAL_TOO = ImageLimits(max_images=4, max_bytes=64 * 1024, allow_remote=True, allow_internal_hosts=True)
URLS = [f"http://images.example/{i}.png" for i in range(3)]
CREDENTIALS = r"image URLs with credentials \(user:password@host\) are not fetched"


class _SlowRemote:
    """A fake clock, and a stub `_fetch` that takes `seconds_each` of it and is cut off at the
    deadline it is handed, as the real one is; `fetched` lists the URLs it was asked for."""

    def __init__(self, monkeypatch, seconds_each: float):
        self.now, self.seconds_each, self.fetched = 1000.0, seconds_each, []
        monkeypatch.setattr(decode_module, "time", SimpleNamespace(monotonic=lambda: self.now))
        monkeypatch.setattr(decode_module, "_fetch", self.fetch)

    def fetch(self, url: str, limits: ImageLimits, deadline: float) -> bytes:
        self.fetched.append(url)
        if self.now + self.seconds_each > deadline:
            self.now = deadline
            raise ImageRejected(f"fetching the image URL took longer than {decode_module.FETCH_DEADLINE_S:g} s")
        self.now += self.seconds_each
        return PAYLOAD


def _pipeline(limits: ImageLimits) -> ImagePipeline:
    params = PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
    return ImagePipeline(params, LayoutParams(7, 2, 56, 14), (80,), limits)


@pytest.mark.parametrize("path", ["decode_image_urls", "pipeline"])
def test_the_fetches_of_one_request_share_one_deadline(monkeypatch, path):
    """Three remote images that each take 6 of the 10 s: the second is cut off at 10 s from the
    request's start. Each fetch had a deadline of its own, so a request of `--max-images` images
    that each trickled in just under it held a preparation thread for that many times 10 s."""
    remote = _SlowRemote(monkeypatch, seconds_each=6.0)
    sources = [ImageSource(url, f"messages[0].content[{i}]") for i, url in enumerate(URLS)]
    with pytest.raises(ImageRejected, match="took longer than 10 s") as caught:
        if path == "pipeline":
            _pipeline(PUBLIC_ONLY).prepare(sources, (1, 7, 7, 7, 2))
        else:
            decode_image_urls(sources, PUBLIC_ONLY)
    assert caught.value.param == "messages[0].content[1]"
    assert remote.fetched == URLS[:2] and remote.now == 1010.0


def test_a_fetch_past_the_requests_deadline_is_not_started(monkeypatch):
    remote = _SlowRemote(monkeypatch, seconds_each=10.0)  # the first fetch takes the whole budget
    with pytest.raises(ImageRejected, match=r"the request's image URLs took longer than 10 s in all"):
        decode_image_urls(URLS[:2], PUBLIC_ONLY)
    assert remote.fetched == URLS[:1]


def test_images_within_the_deadline_are_fetched(monkeypatch):
    remote = _SlowRemote(monkeypatch, seconds_each=3.0)
    prepared = _pipeline(PUBLIC_ONLY).prepare(URLS, (1, 7, 7, 7, 2))
    assert len(prepared.images) == 3 and remote.fetched == URLS
    assert [image.image.size for image in decode_image_urls(URLS[:1], PUBLIC_ONLY)] == [(30, 20)]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    accepted = 0

    def get_request(self):
        self.accepted += 1
        return super().get_request()


def _serve(redirects: dict[str, str]) -> _Server:
    """A server of `PAYLOAD` on 127.0.0.1 that redirects each path of `redirects` to its URL
    (``{port}`` its own port)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path in redirects:
                self.send_response(302)
                self.send_header("Location", redirects[self.path].format(port=self.server.server_address[1]))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args):
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop to poll: every 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture()
def local():
    server = _serve({"/credentials": "http://user:s3cret@127.0.0.1:{port}/cat.png",
                     "/port": "http://127.0.0.1:99999999999999999999/cat.png"})
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("limits", [PUBLIC_ONLY, INTERNAL_TOO], ids=["public-only", "internal-too"])
@pytest.mark.parametrize("authority", ["user:s3cret@127.0.0.1:{port}", "s3cret@127.0.0.1:{port}",
                                       "@127.0.0.1:{port}", "evil.example\\@127.0.0.1:{port}"],
                         ids=["user-password", "user", "empty", "backslash"])
def test_a_url_with_credentials_is_refused_by_name_without_a_connection(local, limits, authority):
    """urllib took ``user:password@host`` as the host name: the fetch failed to resolve it, and the
    400 quoted the password back ('cannot resolve 'user:s3cret@127.0.0.1'')."""
    url = ImageSource(f"http://{authority.format(port=local.server_address[1])}/cat.png", "messages[0].content[0]")
    with pytest.raises(ImageRejected, match=CREDENTIALS) as caught:
        decode_image_url(url, limits)
    assert "s3cret" not in str(caught.value) and caught.value.param == "messages[0].content[0]"
    assert local.accepted == 0


def test_a_redirect_to_a_url_with_credentials_is_refused(local):
    port = local.server_address[1]
    with pytest.raises(ImageRejected, match=f"redirects to a URL this server does not fetch: {CREDENTIALS}") as caught:
        decode_image_urls([f"http://127.0.0.1:{port}/credentials"], INTERNAL_TOO)
    assert "s3cret" not in str(caught.value) and local.accepted == 1
    # an @ past the authority (path, query, fragment) is no credential
    assert decode_image_urls([f"http://127.0.0.1:{port}/cat@2x.png?by=a@b"], INTERNAL_TOO)[0].image.size == (30, 20)


@pytest.mark.parametrize("url", [
    "http://[2002:a00:1::1]/cat.png", "http://[2002:7f00:1::]/cat.png", "http://[2002:a9fe:a9fe::1]/latest/",
    "http://[2002:c0a8:1::5]:8080/cat.png", "http://[fec0::1]/cat.png", "http://[feff:ffff::1]/cat.png",
], ids=["6to4-10/8", "6to4-loopback", "6to4-metadata", "6to4-192.168", "site-local", "site-local-top"])
def test_6to4_forms_of_internal_addresses_and_site_local_ones_are_internal(monkeypatch, url):
    """Python counts 2002::/16 and fec0::/10 as global: a 6to4 address carrying 10.0.0.1 (which a
    host with a 6to4 route delivers to 10.0.0.1) and a site-local one were connected to."""
    connects = []
    monkeypatch.setattr(decode_module.socket, "create_connection", lambda *a, **k: connects.append(a))
    with pytest.raises(ImageRejected, match="internal address"):
        decode_image_urls([url], PUBLIC_ONLY)
    assert connects == []


def test_a_6to4_form_of_a_public_address_is_not_internal():
    assert not decode_module._is_internal("2002:808:808::1")  # 8.8.8.8
    assert decode_module._is_internal("2002:a00:1::1") and decode_module._is_internal("fec0::1")


@pytest.mark.parametrize("limits", [PUBLIC_ONLY, INTERNAL_TOO], ids=["public-only", "internal-too"])
@pytest.mark.parametrize("port, problem", [
    ("99999999999999999999", "Port out of range 0-65535"), ("65616", "Port out of range 0-65535"),
    ("-1", "Port could not be cast to integer value as '-1'"), ("8_0", "Port could not be cast"),
], ids=["huge", "wraps-to-80", "negative", "underscore"])
def test_a_port_out_of_range_is_a_400_without_a_connection(monkeypatch, limits, port, problem):
    """urllib handed ``:99999999999999999999`` to the resolver, whose OverflowError escaped as a 500
    ('internal error: OverflowError'); ``:65616`` was connected to as port 80 (65616 - 65536)."""
    looked_up, connects = [], []
    monkeypatch.setattr(decode_module, "_resolve", lambda host, port: looked_up.append(port) or ["93.184.216.34"])
    monkeypatch.setattr(decode_module.socket, "create_connection", lambda *a, **k: connects.append(a))
    url = ImageSource(f"http://images.example:{port}/cat.png", "messages[0].content[2]")
    with pytest.raises(ImageRejected, match=f"the image URL is not valid: {problem}") as caught:
        decode_image_url(url, limits)
    assert caught.value.param == "messages[0].content[2]" and looked_up == [] and connects == []


def test_a_redirect_to_a_port_out_of_range_is_a_400(local):
    with pytest.raises(ImageRejected, match="redirects to a URL this server does not fetch: the image URL is not "
                                            "valid: Port out of range"):
        decode_image_urls([f"http://127.0.0.1:{local.server_address[1]}/port"], INTERNAL_TOO)
    assert local.accepted == 1
