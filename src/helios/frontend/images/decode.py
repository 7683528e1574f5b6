"""Image sources to decoded pixels: `data:` URLs (base64 PNG, JPEG or WebP), bounded.

Remote http(s) URLs are fetched only when the operator enables it (`ImageLimits.allow_remote`,
`helios serve --allow-remote-images`), bounded by the same byte limit. Every failure is an
`ImageRejected` (HTTP 400) naming the problem: a remote URL while fetching is off, a failed fetch, a malformed data URL or base64 payload, a media type that is not an image, more bytes or
pixels than the limits, bytes that are not an image, and a truncated image. The image's content
hash (SHA-256 of the decoded bytes) keys its vision features in the prefix cache.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass

from helios.frontend.images.errors import ImageRejected

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_DATA_URL = re.compile(r"^data:(?P<media>[A-Za-z0-9.+/-]*)(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?,(?P<data>.*)$",
                       re.DOTALL)


@dataclass(frozen=True)
class ImageLimits:
    """Per-request bounds on image inputs."""

    max_images: int = 4
    max_bytes: int = 8 * 1024 * 1024
    max_pixels: int = 4096 * 4096
    allow_remote: bool = False


@dataclass(frozen=True)
class DecodedImage:
    image: object  # a fully loaded PIL image
    digest: str  # sha256 hex of the encoded bytes


def image_bytes_of(url: str, limits: ImageLimits) -> bytes:
    """The encoded bytes of an image URL; remote URLs are refused unless fetching is enabled."""
    if not url.startswith("data:"):
        if url.startswith(("http://", "https://")):
            if limits.allow_remote:
                return fetch_image(url, limits)
            raise ImageRejected("remote image URLs are not fetched by this server; send a data: URL")
        raise ImageRejected("image_url must be a data: URL (data:image/png;base64,...)")
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageRejected("malformed data: URL (expected data:image/...;base64,...)")
    media = match.group("media").lower()
    if media not in FORMATS.values():
        raise ImageRejected(f"data: URL media type {media or '(none)'!r} is not image/png, image/jpeg or image/webp")
    if not match.group("b64"):
        raise ImageRejected("data: URL images must be base64-encoded (;base64)")
    payload = match.group("data")
    if len(payload) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected("data: URL payload is not valid base64") from None
    if not data:
        raise ImageRejected("data: URL image is empty")
    if len(data) > limits.max_bytes:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    return data


FETCH_TIMEOUT_S = 10.0


def fetch_image(url: str, limits: ImageLimits) -> bytes:
    """The bytes at an http(s) URL (only when the operator enabled fetching), within the byte bound."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 - http(s) only
            data = response.read(limits.max_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise ImageRejected(f"cannot fetch image URL: {getattr(error, 'reason', error)}") from None
    if len(data) > limits.max_bytes:
        raise ImageRejected(f"image is larger than the {limits.max_bytes}-byte limit")
    if not data:
        raise ImageRejected("fetched image is empty")
    return data


def decode_image(data: bytes, limits: ImageLimits) -> DecodedImage:
    """A PNG, JPEG or WebP image, fully loaded; its pixel count bounded before decoding."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=list(FORMATS))
    except UnidentifiedImageError:
        raise ImageRejected("image data is not a PNG, JPEG or WebP image") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise ImageRejected(f"image data cannot be read: {error}") from None
    if image.width * image.height > limits.max_pixels:
        raise ImageRejected(f"image has {image.width}x{image.height} pixels; at most {limits.max_pixels} are accepted")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise ImageRejected(f"image data is truncated or corrupt: {error}") from None
    return DecodedImage(image, hashlib.sha256(data).hexdigest())


def decode_image_urls(urls: list[str], limits: ImageLimits) -> list[DecodedImage]:
    """Every image of one request, within the request's count bound."""
    if len(urls) > limits.max_images:
        raise ImageRejected(f"a request may carry at most {limits.max_images} images; it has {len(urls)}")
    return [decode_image(image_bytes_of(url, limits), limits) for url in urls]
