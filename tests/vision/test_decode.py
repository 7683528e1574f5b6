"""Image URLs: data: URLs decode; each bad input is an ImageRejected (400) naming the problem."""

from __future__ import annotations

import base64

import pytest

from helios.frontend.images.decode import ImageLimits, decode_image_urls
from helios.frontend.images.errors import ImageRejected

from .tiny_vl import image_bytes

pytest.importorskip("PIL")
LIMITS = ImageLimits(max_images=2, max_bytes=64 * 1024, max_pixels=400 * 400)


def url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("fmt,media", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_formats_decode_with_content_hash(fmt, media):
    data = image_bytes(50, 30, 1, fmt)
    (first,), (second,) = decode_image_urls([url(data, media)], LIMITS), decode_image_urls([url(data, media)], LIMITS)
    assert first.image.size == (50, 30) and first.digest == second.digest
    other = decode_image_urls([url(image_bytes(50, 30, 2, fmt), media)], LIMITS)[0]
    assert other.digest != first.digest


@pytest.mark.parametrize("source,problem", [
    ("https://example.com/cat.png", "remote image URLs"),
    ("ftp://x", "must be a data: URL"),
    ("data:image/png;base64", "malformed data: URL"),
    ("data:text/plain;base64,aGVsbG8=", "'text/plain' is not image"),
    ("data:image/png,rawbytes", "base64-encoded"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("data:image/png;base64,", "empty"),
    ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "not a PNG, JPEG, WebP or GIF"),
])
def test_bad_sources_name_the_problem(source, problem):
    with pytest.raises(ImageRejected, match=problem) as caught:
        decode_image_urls([source], LIMITS)
    assert caught.value.http_status == 400


def test_truncated_image():
    data = image_bytes(120, 80, 3, "PNG")
    with pytest.raises(ImageRejected, match="truncated|cannot be read"):
        decode_image_urls([url(data[: len(data) // 2])], LIMITS)


def test_bounds():
    small = url(image_bytes(20, 20, 1))
    with pytest.raises(ImageRejected, match="at most 2 images"):
        decode_image_urls([small] * 3, LIMITS)
    with pytest.raises(ImageRejected, match="byte limit"):
        decode_image_urls([url(b"\0" * (LIMITS.max_bytes + 1))], LIMITS)
    with pytest.raises(ImageRejected, match="401x400 pixels"):
        decode_image_urls([url(_solid(401, 400))], LIMITS)
    assert decode_image_urls([url(_solid(400, 400))], LIMITS)[0].image.size == (400, 400)


def _solid(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


def test_remote_urls_are_fetched_only_when_enabled():
    import http.server
    import threading

    from helios.frontend.images.decode import decode_image_urls

    payload = image_bytes(30, 20, 4)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = payload if self.path == "/cat.png" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop to poll: every 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ImageRejected, match="not fetched"):
            decode_image_urls([url + "/cat.png"], LIMITS)
        enabled = ImageLimits(max_images=2, max_bytes=64 * 1024, max_pixels=400 * 400, allow_remote=True,
                              allow_internal_hosts=True)
        (decoded,) = decode_image_urls([url + "/cat.png"], enabled)
        assert decoded.image.size == (30, 20)
        with pytest.raises(ImageRejected, match="cannot fetch image URL"):
            decode_image_urls([url + "/missing.png"], enabled)
        small = ImageLimits(max_bytes=16, allow_remote=True, allow_internal_hosts=True)
        with pytest.raises(ImageRejected, match="16-byte limit"):
            decode_image_urls([url + "/cat.png"], small)
    finally:
        server.shutdown()
