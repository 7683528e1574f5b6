"""Hostile and malformed images through the OpenAI chat API (the tiny Qwen2.5-VL core served in this
process, driven over ASGI) and through the frontend's functions: every bad image is a 400 whose body
names the problem and whose ``param`` is the image's part (``messages[i].content[j]``), never a 500,
a hang or a dead worker; decompression bombs are refused from their header; a request holds one
decoded image at a time; odd but valid images (16-bit, palette, CMYK, transparency, 1x1) prepare
exactly as transformers' processor does; remote fetches are bounded in time and scheme."""

from __future__ import annotations

import asyncio
import base64
import gc
import http.server
import io
import re
import socket
import struct
import threading
import time
import weakref
import zlib

import httpx
import numpy as np
import pytest

from helios.frontend.images import decode as decode_module
from helios.frontend.images import pipeline as pipeline_module
from helios.frontend.images.decode import MAX_DATA_URL_HEADER, ImageLimits, decode_image_urls
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.preparation import PreparationParams, prepare_image
from helios.server.app import create_app

from .tiny_vl import MAX_PIXELS, MEAN, MIN_PIXELS, STD, hf_image_processor, image_bytes
from .vl_checkpoint import SERVED_ID, served_vl_core

PIL = pytest.importorskip("PIL.Image")
LIMITS = ImageLimits(max_images=2, max_bytes=256 * 1024)
GOOD = "data:image/png;base64," + base64.b64encode(image_bytes(40, 30, 1)).decode()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A well-formed PNG header (valid CRCs) declaring `width` x `height` RGB, with one tiny IDAT."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + _chunk(b"IEND", b""))


def webp_declaring(width: int, height: int) -> bytes:
    """An animated WebP whose VP8X canvas is patched to `width` x `height`."""
    frames = [PIL.new("RGB", (16, 16), (80 * i, 255 - 80 * i, 0)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], duration=100)
    data = bytearray(out.getvalue())
    assert data[12:16] == b"VP8X"
    data[24:27], data[27:30] = (width - 1).to_bytes(3, "little"), (height - 1).to_bytes(3, "little")
    return bytes(data)


def saved(image, fmt: str = "PNG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


# --- through the server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_vl_core(tmp_path_factory.getbasetemp(), LIMITS) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


def chat(app, messages: list[dict]) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post("/v1/chat/completions",
                                     json={"model": SERVED_ID, "messages": messages, "max_tokens": 1})

    return asyncio.run(scenario())


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400, error
    return error


@pytest.mark.parametrize("data, problem", [
    (png_declaring(50_000, 50_000), "image has 2500000000 pixels; at most"),
    (webp_declaring(16_000, 16_000), "image has 256000000 pixels; at most"),
], ids=["png-50000x50000", "animated-webp-16000x16000"])
def test_a_decompression_bomb_is_a_400_and_the_server_serves_on(app, served, data, problem):
    media = "image/webp" if data.startswith(b"RIFF") else "image/png"
    error = error_of(chat(app, [{"role": "user", "content": [image_part(data_url(data, media))]}]))
    assert problem in error["message"] and error["param"] == "messages[0].content[0]", error
    assert chat(app, [{"role": "user", "content": [image_part(GOOD)]}]).status_code == 200
    assert served.is_healthy


@pytest.mark.parametrize("width, height", [(50_000, 50_000), (9_000, 9_000)], ids=["past-pil-limit", "past-ours"])
def test_a_bomb_is_refused_from_its_header(monkeypatch, width, height):
    """Refused before any pixel is decoded (no `load`), whether PIL's own bound or ours refuses it."""
    from PIL import ImageFile

    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: loads.append(image.size) or real_load(image))
    with pytest.raises(ImageRejected, match=f"image has {width * height} pixels|{width}x{height} pixels"):
        decode_image_urls([data_url(png_declaring(width, height))], LIMITS)
    assert loads == []
    # a good image loads (reading its EXIF orientation calls `load` again, which decodes nothing more)
    assert decode_image_urls([GOOD], LIMITS)[0].image.size == (40, 30) and set(loads) == {(40, 30)}


BAD = [
    ("data:image/png;base64,@@@@", "not valid base64: '@' at offset 0"),
    ("data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode(), "'image/svg+xml' is not image/png"),
    (data_url(saved(PIL.new("RGB", (8, 8)), "BMP")), "is a BMP image; only PNG, JPEG, WebP and GIF"),
    ("file:///etc/passwd", "'file' URLs are not accepted"),
    ("https://example.com/cat.png", "remote image URLs are not fetched"),
    (data_url(png_declaring(9000, 9000)), "9000x9000 pixels"),
    (data_url(saved(PIL.new("RGB", (1, 201)))), "image aspect ratio 201.0 exceeds 200"),
]


@pytest.mark.parametrize("url, problem", BAD, ids=[
    "base64", "svg", "bmp-bytes", "file", "remote", "pixels", "thin"])
def test_an_image_error_names_its_part(app, url, problem):
    messages = [{"role": "user", "content": "first"},
                {"role": "user", "content": [image_part(GOOD), {"type": "text", "text": "and"}, image_part(url)]}]
    error = error_of(chat(app, messages))
    assert error["param"] == "messages[1].content[2]", error
    assert error["message"].startswith("messages[1].content[2]: ") and problem in error["message"], error


def test_count_and_shape_errors_stay_400s(app):
    too_many = error_of(chat(app, [{"role": "user", "content": [image_part(GOOD)] * 3}]))
    assert "at most 2 images; it has 3" in too_many["message"] and too_many["param"] == "messages"
    for role in ("system", "assistant"):
        messages = [{"role": role, "content": [image_part(GOOD)]}, {"role": "user", "content": "hi"}]
        assert error_of(chat(app, messages))["param"] == "messages[0].content"
    for part in ({"type": "image_url", "image_url": GOOD}, {"type": "image_url", "image_url": {"url": GOOD,
                                                                                               "detail": "ultra"}},
                 {"type": "image_url", "image_url": {"url": GOOD, "size": 3}}, {**image_part(GOOD), "x": 1}):
        assert error_of(chat(app, [{"role": "user", "content": [part]}]))["param"] == "messages[0].content"


def test_too_many_image_parts_are_refused_before_the_prompt_is_rendered(app, monkeypatch):
    """The text bound leaves image parts out: 20000 tiny image parts (a 1 MB body) were rendered and
    tokenized (seconds of a preparation worker) before the count was refused."""
    from helios.frontend.preparation.prompt import PromptBuilder

    builds = []
    real_build = PromptBuilder.build
    monkeypatch.setattr(PromptBuilder, "build", lambda self, *args, **kwargs: builds.append(1) or real_build(
        self, *args, **kwargs))
    error = error_of(chat(app, [{"role": "user", "content": [image_part("data:,")] * 20_000}]))
    assert "at most 2 images; it has 20000" in error["message"] and error["param"] == "messages", error
    assert builds == []
    assert chat(app, [{"role": "user", "content": [image_part(GOOD)]}]).status_code == 200 and builds == [1]


# --- decoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url, problem", [
    ("data:image/png;base64," + base64.encodebytes(image_bytes(40, 30, 1)).decode(), "whitespace at offset 76"),
    ("data:image/png;base64," + base64.urlsafe_b64encode(b"\xfb\xff" * 30).decode(), "URL-safe base64"),
    ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n!!").decode().rstrip("="),
     "not a multiple of 4 (missing '=' padding?)"),
    ("data:image/png;base64,AA==AAAA", "'=' padding at offset 2 before the end"),
    ("ftp://host/cat.png", "'ftp' URLs are not accepted"),
], ids=["wrapped", "url-safe", "unpadded", "inner-padding", "ftp"])
def test_malformed_payloads_are_named(url, problem):
    with pytest.raises(ImageRejected, match=re.escape(problem)):
        decode_image_urls([url], LIMITS)


@pytest.mark.parametrize("url", [
    "x" * 100_000 + ":cat.png",
    "data:image/" + "x" * 1_000 + ";base64,AAAA",  # (a longer header is refused unquoted: see below)
    "http://127.0.0.1:1/" + "\x01" * 100_000,
], ids=["scheme", "media-type", "fetched-url"])
def test_an_error_quotes_at_most_a_clip_of_the_client_text(url):
    with pytest.raises(ImageRejected) as caught:
        decode_image_urls([url], ALLOWED)
    assert "characters)" in str(caught.value)
    assert len(str(caught.value)) < 400, str(caught.value)[:400]


def test_a_data_url_header_is_bounded_before_it_is_parsed():
    """A data: URL's header (media type and parameters, before its first comma) of more than
    `MAX_DATA_URL_HEADER` characters is refused unparsed: the header regex held the GIL about half a
    microsecond a character, so a body-sized header of semicolons stalled every thread of the server,
    its event loop included, for seconds (and one ending in ;base64 before a valid payload was served).
    A header at the bound, and a URL of no comma however long, are judged as before."""
    payload = base64.b64encode(image_bytes(40, 30, 1)).decode()
    long_header = "data:image/png" + ";" * 2_000_000 + ";base64"
    with pytest.raises(ImageRejected, match=f"has {len(long_header)} characters; at most {MAX_DATA_URL_HEADER} are"):
        decode_image_urls([long_header + "," + payload], LIMITS)
    with pytest.raises(ImageRejected, match=re.escape("malformed data: URL (expected data:image/...;base64,...)")):
        decode_image_urls(["data:image/png" + ";" * 2_000_000 + "base64" + payload], LIMITS)
    name = ";name=" + "x" * (MAX_DATA_URL_HEADER - len("data:image/png;name=;base64"))
    at_bound = f"data:image/png{name};base64"
    assert len(at_bound) == MAX_DATA_URL_HEADER
    assert decode_image_urls([f"{at_bound},{payload}"], LIMITS)[0].image.size == (40, 30)


def test_the_default_limits_are_the_documented_ones():
    """A server built without image limits (`ServedModel.from_runtime`) bounds images as `helios
    serve` does: 2 MiB (its 8 MiB default was four times the documented bound)."""
    over = b"\x89PNG\r\n\x1a\n" + b"\0" * (2 * 1024 * 1024)
    with pytest.raises(ImageRejected, match="larger than the 2097152-byte limit"):
        decode_image_urls([data_url(over)], ImageLimits())


def _bad_crc() -> bytes:
    data = bytearray(saved(PIL.new("RGB", (20, 20))))
    data[29] ^= 0xFF  # inside IHDR's CRC
    return bytes(data)


@pytest.mark.parametrize("data, problem", [
    (_bad_crc(), "PNG image data is corrupt: broken PNG file (bad header checksum"),
    (png_declaring(10, 0), "PNG image data is corrupt: its width or height is 0"),
    (saved(PIL.new("RGB", (8, 8)), "BMP"), "is a BMP image"),
    (b"\xff\xd8\xff\xe0" + b"\0" * 30, "JPEG image data is corrupt"),
], ids=["bad-crc", "zero-height", "bmp-bytes", "jpeg-garbage"])
def test_corrupt_images_are_named_as_such(data, problem):
    with pytest.raises(ImageRejected, match=re.escape(problem)):
        decode_image_urls([data_url(data)], LIMITS)


@pytest.mark.parametrize("media", ["image/jpg", "IMAGE/JPG", "image/jpeg"])
def test_image_jpg_is_taken_as_jpeg(media):
    """image/jpg is a common non-standard alias of image/jpeg (it was refused as not an image type);
    the bytes still decide the format: a PNG under it decodes as the PNG it is, junk is still refused."""
    (jpeg,) = decode_image_urls([data_url(image_bytes(20, 10, 3, "JPEG"), media)], LIMITS)
    assert jpeg.image.format == "JPEG" and jpeg.image.size == (20, 10)
    (png,) = decode_image_urls([data_url(image_bytes(20, 10, 3), media)], LIMITS)
    assert png.image.format == "PNG"
    with pytest.raises(ImageRejected, match="not a PNG, JPEG, WebP or GIF image"):
        decode_image_urls([data_url(b"hello, not an image", media)], LIMITS)
    with pytest.raises(ImageRejected, match="'image/bmp' is not image/png, image/jpeg, image/webp or image/gif"):
        decode_image_urls([data_url(image_bytes(20, 10, 3, "JPEG"), "image/bmp")], LIMITS)


def test_a_gif_is_taken_as_openai_takes_it():
    """OpenAI's image inputs include GIF (it was a 400, 'only PNG, JPEG and WebP'): a palette GIF
    with a transparent index decodes to its pixels, an animated one to its first frame."""
    palette = PIL.new("P", (12, 6))
    palette.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    palette.paste(1, (6, 0, 12, 6))
    (gif,) = decode_image_urls([data_url(saved(palette, "GIF"), "image/gif")], LIMITS)
    assert gif.image.format == "GIF" and gif.image.size == (12, 6)
    assert gif.image.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    assert gif.image.convert("RGB").getpixel((11, 5)) == (0, 0, 255)
    frames = [PIL.new("RGB", (8, 8), color) for color in ((0, 255, 0), (255, 255, 255))]
    animated = io.BytesIO()
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], duration=50)
    (first,) = decode_image_urls([data_url(animated.getvalue(), "image/gif")], LIMITS)
    assert first.image.n_frames == 2 and first.image.convert("RGB").getpixel((4, 4)) == (0, 255, 0)
    with pytest.raises(ImageRejected, match="GIF image data is corrupt|truncated or corrupt"):
        decode_image_urls([data_url(saved(palette, "GIF")[:40], "image/gif")], LIMITS)


def test_image_jpg_through_the_chat_api(app):
    url = data_url(image_bytes(40, 30, 1, "JPEG"), "image/jpg")
    assert chat(app, [{"role": "user", "content": [image_part(url)]}]).status_code == 200


def test_url_schemes_are_case_insensitive():
    upper = "DATA:IMAGE/PNG;BASE64," + base64.b64encode(image_bytes(20, 10, 3)).decode()
    assert decode_image_urls([upper], LIMITS)[0].image.size == (20, 10)
    with pytest.raises(ImageRejected, match="remote image URLs are not fetched"):
        decode_image_urls(["HTTPS://example.com/cat.png"], LIMITS)


def test_a_request_holds_one_decoded_image_at_a_time(monkeypatch):
    """Each image is prepared (reduced to its patches) before the next is decoded, so a request's
    transient memory is one image's pixels (up to --max-image-pixels), not max_images of them."""
    from helios.frontend.images.layout import LayoutParams

    decoded, alive_at_prepare = [], []
    real_decode, real_prepare = decode_module.decode_image, pipeline_module.prepare_image

    def decode(data, limits):
        result = real_decode(data, limits)
        decoded.append(weakref.ref(result.image))
        return result

    def prepare(image, params, digest):
        gc.collect(0)  # the youngest generation (a freed image's): a full collection walks the whole test process
        alive_at_prepare.append(sum(ref() is not None for ref in decoded))
        return real_prepare(image, params, digest)

    monkeypatch.setattr(decode_module, "decode_image", decode)
    monkeypatch.setattr(pipeline_module, "prepare_image", prepare)
    params = PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
    pipeline = pipeline_module.ImagePipeline(params, LayoutParams(7, 2, 56, 14), (80,), ImageLimits(max_images=3))
    urls = [data_url(image_bytes(60, 40, seed)) for seed in (1, 2, 3)]
    prepared = pipeline.prepare(urls, (1, 7, 7, 7, 2))
    assert len(prepared.images) == 3 and alive_at_prepare == [1, 1, 1]


ODD = {
    "16-bit-gray": lambda rgb, alpha: saved(PIL.fromarray(rgb[..., 0].astype(np.uint16) * 257)),
    "palette-transparency": lambda rgb, alpha: saved(PIL.fromarray(rgb).convert("P"), transparency=5),
    "gray-alpha": lambda rgb, alpha: saved(PIL.fromarray(np.dstack([rgb[..., 0], alpha]), "LA")),
    "rgba": lambda rgb, alpha: saved(PIL.fromarray(np.dstack([rgb, alpha]))),
    "rgba-webp": lambda rgb, alpha: saved(PIL.fromarray(np.dstack([rgb, alpha])), "WEBP", lossless=True),
    "gray": lambda rgb, alpha: saved(PIL.fromarray(rgb).convert("L")),
    "bilevel": lambda rgb, alpha: saved(PIL.fromarray(rgb).convert("1")),
    "cmyk-jpeg": lambda rgb, alpha: saved(PIL.fromarray(rgb).convert("CMYK"), "JPEG"),
    "1x1": lambda rgb, alpha: saved(PIL.fromarray(rgb[:1, :1])),
    "apng": lambda rgb, alpha: saved(PIL.fromarray(rgb), save_all=True,
                                     append_images=[PIL.fromarray(255 - rgb)] * 20),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_valid_images_prepare_as_transformers_does(name):
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 255, size=(45, 67, 3), dtype=np.uint8)
    data = ODD[name](rgb, rng.integers(0, 255, size=(45, 67), dtype=np.uint8))
    media = "image/jpeg" if name.endswith("jpeg") else "image/webp" if name.endswith("webp") else "image/png"
    (decoded,) = decode_image_urls([data_url(data, media)], LIMITS)
    ours = prepare_image(decoded.image, PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS), decoded.digest)
    reference = hf_image_processor()(images=[PIL.open(io.BytesIO(data))], return_tensors="np")
    assert [1, ours.grid_h, ours.grid_w] == reference["image_grid_thw"][0].tolist()
    np.testing.assert_array_equal(ours.patches, reference["pixel_values"])


# --- remote fetches ------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    payload = image_bytes(30, 20, 4)

    def do_GET(self):  # noqa: N802
        if self.path == "/ftp":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1:1/cat.png")
            self.end_headers()
        elif self.path == "/slow":  # 40 bytes of a 10000-byte body, 50 ms apart: 2 s at least
            self.send_response(200)
            self.send_header("Content-Length", "10000")
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:  # the fetch gave up and closed the connection
                pass
        elif self.path == "/slow-headers":  # a header of 40 bytes, 50 ms apart
            self.wfile.write(b"HTTP/1.0 200 OK\r\n")
            try:
                for _ in range(40):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
                self.wfile.write(b": y\r\n\r\n")
            except OSError:
                pass
        elif self.path == "/jpg":  # the non-standard alias as the Content-Type
            body = image_bytes(30, 20, 4, "JPEG")
            self.send_response(200)
            self.send_header("Content-Type", "image/jpg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/chunked-cut":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"400\r\n" + self.payload[:100])
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.payload)))
            self.end_headers()
            self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def remote():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    # shutdown() waits for the loop to poll: every 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


ALLOWED = ImageLimits(max_images=2, max_bytes=64 * 1024, allow_remote=True, allow_internal_hosts=True)


def test_remote_fetches_follow_http_redirects_only(remote):
    assert decode_image_urls([f"HTTP://{remote}/cat.png"], ALLOWED)[0].image.size == (30, 20)
    with pytest.raises(ImageRejected, match="redirects to a URL that is not http"):
        decode_image_urls([f"http://{remote}/ftp"], ALLOWED)


def test_a_remote_image_served_as_image_jpg_is_fetched(remote):
    (image,) = decode_image_urls([f"http://{remote}/jpg"], ALLOWED)
    assert image.image.format == "JPEG" and image.image.size == (30, 20)


@pytest.mark.parametrize("path", ["/slow", "/slow-headers"])
def test_a_trickling_remote_is_cut_off(remote, monkeypatch, path):
    monkeypatch.setattr(decode_module, "FETCH_DEADLINE_S", 0.3)  # each read may still wait FETCH_TIMEOUT_S
    with pytest.raises(ImageRejected, match="took longer than 0.3 s"):
        decode_image_urls([f"http://{remote}{path}"], ALLOWED)


def test_a_broken_remote_response_is_a_400(remote):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def garbage():
        connection, _ = listener.accept()
        connection.recv(4096)
        connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        connection.close()

    threading.Thread(target=garbage, daemon=True).start()
    try:
        with pytest.raises(ImageRejected, match="cannot fetch image URL"):
            decode_image_urls([f"http://127.0.0.1:{listener.getsockname()[1]}/cat.png"], ALLOWED)
    finally:
        listener.close()
    with pytest.raises(ImageRejected, match="cannot fetch image URL"):
        decode_image_urls([f"http://{remote}/chunked-cut"], ALLOWED)
