"""Image sources to decoded pixels: `data:` URLs (base64 PNG, JPEG, WebP or GIF), bounded.

Remote http(s) URLs are fetched only when the operator enables it (`ImageLimits.allow_remote`,
`helios serve --allow-remote-images`), bounded by the same byte limit and by `FETCH_DEADLINE_S` in
all, the fetches of one request together (a server that trickles its headers or body is cut off,
and several images that each trickle in just under the bound do not add up past it), following
redirects to http(s) URLs only; a URL with credentials (``user:password@host``) or with a port
that is not a number from 0 to 65535, the first or a redirect's, is refused rather than fetched; an
internationalized host name, and spaces or non-ASCII characters after it, are sent as a browser
sends them (IDNA, percent-encoded UTF-8).
Unless the operator allows internal hosts too (`ImageLimits.allow_internal_hosts`,
`--allow-internal-image-hosts`), a fetch connects to public addresses only: each host (every
redirect's included) is resolved once, refused when any of its addresses is loopback, private,
link-local (the cloud metadata address), site-local, unspecified, multicast or reserved
(IPv4-mapped and 6to4 forms of internal IPv4 addresses included), and the connection goes to the
checked address itself (the Host header and TLS name stay the URL's), so a name that resolves anew
in between cannot switch it.

Every failure is an `ImageRejected` (HTTP 400) naming the problem: a remote URL while fetching is
off, a failed fetch, an internal host, a malformed data URL (a header, before its comma, of more
than `MAX_DATA_URL_HEADER` characters included) or base64 payload (whitespace, URL-safe
characters and missing padding named as such), a media type that is not an image, more bytes or
pixels than the limits (a decompression bomb whose header declares billions of pixels included),
a JPEG of more than `MAX_JPEG_SCANS` scans (each costs a pass over the whole image), bytes that
are not an image (another format is named), a corrupt or truncated PNG, JPEG, WebP or GIF.
URL schemes are case-insensitive; errors quote at most a clip of the client's text. The image's
content hash (SHA-256 of the decoded bytes) keys its vision features in the prefix cache.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import io
import ipaddress
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Sequence

import idna

from helios.frontend.images.errors import ImageRejected

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
# Media types a data: URL may name: the formats', and image/jpg, a common non-standard alias of
# image/jpeg. The bytes decide the format either way (sniffed by `decode_image`).
MEDIA_TYPES = frozenset({*FORMATS.values(), "image/jpg"})
# A data: URL's header, the part before its first comma: media type, parameters and ;base64.
_DATA_HEADER = re.compile(r"data:(?P<media>[A-Za-z0-9.+/-]*)(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?", re.IGNORECASE)
# Characters a data: URL's header may have: a media type (RFC 6838: at most 127 characters a name) and
# a few parameters. Bounded before the header is parsed: the regex takes about half a microsecond a
# character holding the GIL, so a body-sized header (15 MB of ";") stalled every thread of the server,
# its event loop included, for seconds.
MAX_DATA_URL_HEADER = 1024
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=]")
_NOT_SENT_RAW = re.compile(r"[^\x00-\x7f]+| ")  # what a fetched URL's path, query and fragment percent-encode
# Scans a JPEG may have. libjpeg decodes every scan of a progressive JPEG over the whole coefficient
# buffer, and a scan of one EOB run is a few dozen bytes: a 2 MiB JPEG of 60,000 empty scans over
# 4096x4096 pixels took a minute of CPU (past the preparation timeout, holding its slot). Encoders
# write about 10 (libjpeg's and mozjpeg's progressions); 100 scans of a 4096x4096 image decode in
# about a second.
MAX_JPEG_SCANS = 100
_JPEG_MARKER = re.compile(rb"\xff[^\x00\x01\xd0-\xd7\xff]")  # a marker with a length (or EOI)
# Leading bytes of the accepted formats, and of others a client may send by mistake (named in the error).
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF8", "GIF"), (b"BM", "BMP"),
               (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"%PDF", "PDF"), (b"\x00\x00\x01\x00", "ICO"))


@dataclass(frozen=True)
class ImageLimits:
    """Per-request bounds on image inputs; the defaults are `helios serve`'s (README "Images")."""

    max_images: int = 4
    max_bytes: int = 2 * 1024 * 1024
    max_pixels: int = 4096 * 4096
    allow_remote: bool = False
    allow_internal_hosts: bool = False  # remote fetches may reach loopback, private and link-local addresses


@dataclass(frozen=True)
class DecodedImage:
    image: object  # a fully loaded PIL image
    digest: str  # sha256 hex of the encoded bytes


def image_bytes_of(url: str, limits: ImageLimits, deadline: float | None = None) -> bytes:
    """The encoded bytes of an image URL; remote URLs are refused unless fetching is enabled, and
    fetched by `deadline` (see `fetch_image`)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme != "data":
        if scheme in ("http", "https"):
            if limits.allow_remote:
                return fetch_image(url, limits, deadline)
            raise ImageRejected("remote image URLs are not fetched by this server; send a data: URL")
        named = f"; {_clipped(scheme)!r} URLs are not accepted" if scheme else ""
        raise ImageRejected(f"image_url must be a data: URL (data:image/png;base64,...){named}")
    header, comma, payload = url.partition(",")
    if comma and len(header) > MAX_DATA_URL_HEADER:
        raise ImageRejected(f"malformed data: URL: its header (media type and parameters, before the first comma) "
                            f"has {len(header)} characters; at most {MAX_DATA_URL_HEADER} are accepted")
    match = _DATA_HEADER.fullmatch(header) if comma else None
    if match is None:
        raise ImageRejected("malformed data: URL (expected data:image/...;base64,...)")
    media = match.group("media").lower()
    if media not in MEDIA_TYPES:
        raise ImageRejected(f"data: URL media type {_clipped(media) or '(none)'!r} is not image/png, image/jpeg, "
                            "image/webp or image/gif")
    if not match.group("b64"):
        raise ImageRejected("data: URL images must be base64-encoded (;base64)")
    if len(payload) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected(f"data: URL payload is not valid base64{_base64_problem(payload)}") from None
    if not data:
        raise ImageRejected("data: URL image is empty")
    if len(data) > limits.max_bytes:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    return data


FETCH_TIMEOUT_S = 10.0  # each connect and read
FETCH_DEADLINE_S = 10.0  # all of one request's fetches together (the preparation timeout's default)


def fetch_deadline() -> float:
    """The `time.monotonic()` instant by which the fetches of a request starting now must end:
    `FETCH_DEADLINE_S` from now. A request's images share one (`decode_image_urls`,
    `helios.frontend.images.pipeline.ImagePipeline.prepare`): with a deadline of each fetch's own,
    four images that each trickled in just under it held a preparation thread for four times the
    bound, long after the request's preparation had timed out."""
    return time.monotonic() + FETCH_DEADLINE_S


def _too_slow() -> ImageRejected:
    return ImageRejected(f"fetching the request's image URLs took longer than {FETCH_DEADLINE_S:g} s in all")


def fetch_image(url: str, limits: ImageLimits, deadline: float | None = None) -> bytes:
    """The bytes at an http(s) URL (only when the operator enabled fetching), within the byte bound
    and by `deadline` (a `time.monotonic()` instant, the request's `fetch_deadline`; None: a fetch of
    its own): the fetch runs in a thread of its own that the caller waits for until then (name
    resolution, a server that trickles its headers and one that trickles its body included), and a
    fetch that would start past it is refused; a fetch given up on stops by itself at its next body
    read past the deadline, or once a network operation waits `FETCH_TIMEOUT_S`."""
    problem = _url_problem(url)
    if problem is not None:
        raise ImageRejected(problem)
    url = _sent_url(url)
    deadline = fetch_deadline() if deadline is None else deadline
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _too_slow()
    outcome: list = []
    done = threading.Event()

    def fetch() -> None:
        try:
            outcome.append(_fetch(url, limits, deadline))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, which raises it
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=fetch, name="helios-image-fetch", daemon=True).start()
    if not done.wait(remaining):
        raise _too_slow()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _fetch(url: str, limits: ImageLimits, deadline: float) -> bytes:
    if limits.allow_internal_hosts:
        opener = urllib.request.build_opener(_HttpRedirectsOnly())
    else:  # no proxy either: a proxy would reach the internal host on the client's behalf, unchecked
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _PublicHttpHandler(),
                                             _PublicHttpsHandler(), _HttpRedirectsOnly())
    chunks, size = [], 0
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT_S) as response:
            while size <= limits.max_bytes:
                chunk = response.read1(limits.max_bytes + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline and size <= limits.max_bytes:
                    raise _too_slow()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:
        raise ImageRejected(f"cannot fetch image URL: {_clipped(str(getattr(error, 'reason', error)))}") from None
    if size > limits.max_bytes:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    if not size:
        raise ImageRejected("fetched image is empty")
    return b"".join(chunks)


_CREDENTIALS = ("image URLs with credentials (user:password@host) are not fetched; send a URL without them, "
                "or the image as a data: URL")


def _url_problem(url: str) -> str | None:
    """What makes an http(s) URL one this server does not fetch, or None: credentials
    (``user:password@`` before its host: urllib took them as part of the host name, and the error
    quoted the password back), or a port that is not a number from 0 to 65535 (urllib handed
    ``:99999999999999999999`` to the resolver, whose OverflowError was a 500, and connected to
    ``:65616`` as port 80)."""
    authority = url.split("://", 1)[1] if "://" in url else ""
    if "@" in re.split(r"[/?#]", authority, maxsplit=1)[0]:
        return _CREDENTIALS
    try:
        urllib.parse.urlsplit(url).port
    except ValueError as error:
        return f"the image URL is not valid: {_clipped(str(error))}"
    return None


def _sent_url(url: str) -> str:
    """`url` as a browser sends it: an internationalized host name in its IDNA (punycode) form, and
    the non-ASCII characters and spaces of its path, query and fragment percent-encoded as UTF-8
    (urllib sent them raw and failed: "ordinal not in range(256)" for a host such as 例え.テスト,
    "can't contain control characters" for ``/cat photo.png``). Other URLs are sent as they are.
    The host is encoded by IDNA 2008 with UTS #46 non-transitional mapping, as browsers do: Python's
    "idna" codec (IDNA 2003) maps ß to "ss" and sent straße.de to strasse.de, another domain than
    the xn--strae-oqa.de a browser reaches."""
    if url.isascii() and " " not in url:
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if not netloc.isascii():
        try:
            netloc = idna.encode(parts.hostname or "", uts46=True, transitional=False).decode("ascii")
        except idna.IDNAError as error:
            raise ImageRejected(f"the image URL's host is not a valid domain name: {_clipped(str(error))}") from None
        netloc += f":{parts.port}" if parts.port is not None else ""

    def encoded(text: str) -> str:
        return _NOT_SENT_RAW.sub(lambda found: urllib.parse.quote(found.group()), text)

    try:
        return urllib.parse.urlunsplit((parts.scheme, netloc, encoded(parts.path), encoded(parts.query),
                                        encoded(parts.fragment)))
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800") has no UTF-8 form to send
        raise ImageRejected("the image URL holds a lone surrogate, which no URL can send") from None


class _HttpRedirectsOnly(urllib.request.HTTPRedirectHandler):
    """urllib follows redirects to ftp: too; an image fetch follows http(s) ones only (`_url_problem` none)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if newurl.split(":", 1)[0].lower() not in ("http", "https"):
            raise ImageRejected("the image URL redirects to a URL that is not http(s)")
        problem = _url_problem(newurl)
        if problem is not None:
            raise ImageRejected(f"the image URL redirects to a URL this server does not fetch: {problem}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (a name, or an IP in any form the resolver accepts)."""
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def _is_internal(address: str) -> bool:
    """Whether `address` (an IP as the resolver returns it) is not a public unicast address. A 6to4
    address (2002::/16) is as internal as the IPv4 address it carries (a host with a 6to4 route
    delivers it there: 2002:a00:1:: reaches 10.0.0.1), and a deprecated IPv6 site-local one
    (fec0::/10) is internal (Python counts both as global)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) dropped
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:
            return True
        if ip.sixtofour is not None and _is_internal(str(ip.sixtofour)):
            return True
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return (not ip.is_global or ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified
            or ip.is_multicast or ip.is_reserved)


def _public_connection(address: tuple, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
    """A connection to `address`'s host on one of its resolved addresses, each checked first: an
    internal one refuses the fetch before any connection is made."""
    host, port = address
    try:
        resolved = _resolve(host, port)
    except (OSError, UnicodeError) as error:
        raise ImageRejected(f"cannot fetch image URL: cannot resolve {_clipped(str(host))!r}: {error}") from None
    internal = next((ip for ip in resolved if _is_internal(ip)), None)
    if internal is not None:
        shown = _clipped(str(host))
        raise ImageRejected(f"the image URL's host {shown!r} is an internal address ({internal}: loopback, private, "
                            "link-local or reserved); this server fetches images from public addresses only "
                            "(the operator allows internal ones with helios serve --allow-internal-image-hosts)")
    error: OSError | None = None
    for ip in dict.fromkeys(resolved):
        try:
            return socket.create_connection((ip, port), timeout, source_address)
        except OSError as failed:
            error = failed
    raise error if error is not None else OSError(f"{host!r} resolved to no address")


class _PublicHttpConnection(http.client.HTTPConnection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _public_connection


class _PublicHttpsConnection(http.client.HTTPSConnection):
    """Connects to the checked address; the TLS server name and certificate check stay the host's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _public_connection


class _PublicHttpHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_PublicHttpConnection, req)


class _PublicHttpsHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        hostname = {"check_hostname": self._check_hostname} if self._check_hostname is not None else {}
        return self.do_open(_PublicHttpsConnection, req, context=self._context, **hostname)


def _clipped(text: str, limit: int = 120) -> str:
    """`text` as an error quotes it: the client's own text (a scheme, a media type, a URL inside a
    library's reason) can be megabytes long."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _base64_problem(payload: str) -> str:
    """What makes `payload` invalid base64, as a suffix for the error (empty when unclear)."""
    bad = _NOT_BASE64.search(payload)
    if bad is not None:
        char, offset = bad.group(), bad.start()
        if char.isspace():
            return f": whitespace at offset {offset} (send the base64 text unwrapped)"
        if char in "-_":
            return f": {char!r} at offset {offset} is URL-safe base64 (send standard base64, with + and /)"
        return f": {char!r} at offset {offset} is not a base64 character"
    inner = payload.rstrip("=").find("=")
    if inner >= 0:
        return f": '=' padding at offset {inner} before the end"
    if len(payload) % 4:
        return f": {len(payload)} characters are not a multiple of 4 (missing '=' padding?)"
    return ""


def decode_image(data: bytes, limits: ImageLimits) -> DecodedImage:
    """A PNG, JPEG, WebP or GIF image (an animated one: its first frame), fully loaded and turned
    upright by its EXIF orientation (`_upright`); its pixel count bounded before decoding."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=list(FORMATS))
    except Image.DecompressionBombError as error:  # PIL's own bound: a header declaring billions of pixels
        pixels = re.search(r"\((\d+) pixels\)", str(error))
        # PIL refuses past twice its MAX_IMAGE_PIXELS, below a --max-image-pixels set higher than that
        accepted = limits.max_pixels if Image.MAX_IMAGE_PIXELS is None else min(limits.max_pixels,
                                                                                2 * Image.MAX_IMAGE_PIXELS)
        raise ImageRejected(f"image has {pixels.group(1) if pixels else 'too many'} pixels; at most "
                            f"{accepted} are accepted") from None
    except UnidentifiedImageError:
        raise ImageRejected(_unidentified(data)) from None
    except (OSError, ValueError, SyntaxError) as error:
        raise ImageRejected(f"image data cannot be read: {_clipped(str(error))}") from None
    if image.width * image.height > limits.max_pixels:
        raise ImageRejected(f"image has {image.width}x{image.height} pixels; at most {limits.max_pixels} are accepted")
    if image.format in ("JPEG", "MPO") and _jpeg_scan_count(data) > MAX_JPEG_SCANS:
        raise ImageRejected(f"JPEG image has more than {MAX_JPEG_SCANS} scans (a progressive JPEG has about 10)")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise ImageRejected(f"image data is truncated or corrupt: {_clipped(str(error))}") from None
    return DecodedImage(_upright(image), hashlib.sha256(data).hexdigest())


def _upright(image):
    """`image` as a viewer shows it: turned by its EXIF Orientation tag (a phone's portrait photo is
    stored sideways with tag 6), as transformers' `load_image` and vLLM turn it before their image
    processor; the model saw the stored pixels, sideways, on a patch grid of the other shape. An image
    without the tag (or with tag 1) is returned as it is, not copied; EXIF that cannot be read leaves
    the stored pixels, as a viewer shows them."""
    from PIL import ExifTags, ImageOps

    try:
        if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
            return image
        return ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - unreadable metadata: the pixels as stored
        return image


def _jpeg_scan_count(data: bytes) -> int:
    """The scans (SOS markers) of the JPEG stream `data` starts with, counted up to its EOI or to one
    past `MAX_JPEG_SCANS`: marker segments are skipped by their length, entropy-coded data up to its
    next marker (`_JPEG_MARKER`: 0xFF followed by 0x00 is a stuffed data byte, 0xFFD0-D7 a restart
    marker, 0xFFFF a fill byte), found by the regex engine rather than a Python loop per 0xFF byte.
    An embedded thumbnail's scans lie inside an APPn segment and are not counted."""
    count, pos = 0, 2
    while count <= MAX_JPEG_SCANS:
        found = _JPEG_MARKER.search(data, pos)
        if found is None:
            break
        pos = found.start()
        marker = data[pos + 1]
        if marker == 0xD9:  # EOI: the first frame's end (an MPO's next frames follow)
            break
        count += marker == 0xDA
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return count


def _unidentified(data: bytes) -> str:
    """Why PIL identified no accepted format in `data`: a corrupt PNG, JPEG, WebP or GIF (PIL's reason,
    which `Image.open` drops), another format, or bytes of no known image."""
    fmt = "WEBP" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else next(
        (name for signature, name in _SIGNATURES if data.startswith(signature)), None)
    if fmt is None:
        return "image data is not a PNG, JPEG, WebP or GIF image"
    if fmt not in FORMATS:
        return f"image data is a {fmt} image; only PNG, JPEG, WebP and GIF images are accepted"
    if fmt == "PNG" and len(data) >= 24 and 0 in (int.from_bytes(data[16:20], "big"),
                                                  int.from_bytes(data[20:24], "big")):  # IHDR width, height
        return "PNG image data is corrupt: its width or height is 0"
    from PIL import GifImagePlugin, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

    plugin = {"PNG": PngImagePlugin.PngImageFile, "JPEG": JpegImagePlugin.JpegImageFile,
              "WEBP": WebPImagePlugin.WebPImageFile, "GIF": GifImagePlugin.GifImageFile}[fmt]
    try:
        plugin(io.BytesIO(data)).close()  # `Image.open` drops the plugin's reason; opened alone, it raises it
    except Exception as error:  # noqa: BLE001 - any failure of the plugin is the corruption's description
        return f"{fmt} image data is corrupt: {_clipped(str(error)) or type(error).__name__}"
    return f"{fmt} image data is corrupt"


def check_image_count(urls: Sequence[object], limits: ImageLimits) -> None:
    if len(urls) > limits.max_images:
        raise ImageRejected(f"a request may carry at most {limits.max_images} images; it has {len(urls)}")


def decode_image_url(url: str, limits: ImageLimits, deadline: float | None = None) -> DecodedImage:
    """One image URL decoded (a remote one fetched by `deadline`, its request's `fetch_deadline`;
    None: a fetch of its own); an error names the image's part when `url` knows it
    (`helios.frontend.preparation.image_parts.ImageSource`)."""
    try:
        return decode_image(image_bytes_of(url, limits, deadline), limits)
    except ImageRejected as error:
        raise error.at(getattr(url, "where", None)) from None


def decode_image_urls(urls: list[str], limits: ImageLimits) -> list[DecodedImage]:
    """Every image of one request, within the request's count bound, its fetches by one deadline."""
    check_image_count(urls, limits)
    deadline = fetch_deadline()
    return [decode_image_url(url, limits, deadline) for url in urls]
