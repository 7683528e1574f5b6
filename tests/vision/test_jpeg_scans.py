"""A progressive JPEG of many scans is refused before it is decoded: libjpeg decodes each scan over the
whole coefficient buffer, and a scan of one end-of-block run is a few dozen bytes, so a 2 MiB JPEG of
60,000 empty scans over 4096x4096 pixels (within every size limit) took a minute of CPU, past the
preparation timeout and holding a preparation slot all the while. Real encoders write about 10 scans."""

from __future__ import annotations

import base64
import io
import struct

import pytest

from helios.frontend.images import decode as decode_module
from helios.frontend.images.decode import MAX_JPEG_SCANS, ImageLimits, decode_image_urls
from helios.frontend.images.errors import ImageRejected

PIL = pytest.importorskip("PIL.Image")
LIMITS = ImageLimits(max_images=1, max_bytes=2 * 1024 * 1024)


def _segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


def _entropy(bits: str) -> bytes:
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i:i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0)  # byte stuffing
    return bytes(out)


def empty_scans_jpeg(width: int, height: int, num_ac_scans: int) -> bytes:
    """A grayscale progressive JPEG: one DC scan, then `num_ac_scans` AC scans that are each a few
    end-of-block runs of 32767 blocks (about 30 bytes a scan, whatever the image size)."""
    one_code = bytes([1] + [0] * 15)  # a Huffman table of one symbol, code '0'
    head = (b"\xff\xd8" + _segment(0xDB, b"\x00" + bytes([1] * 64))
            + _segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + bytes([1, 0x11, 0]))
            + _segment(0xC4, b"\x00" + one_code + b"\x00") + _segment(0xC4, b"\x10" + one_code + b"\xe0"))
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    dc = _segment(0xDA, bytes([1, 1, 0x00, 0, 0, 0])) + _entropy("0" * blocks)
    ac = _segment(0xDA, bytes([1, 1, 0x00, 1, 63, 0])) + _entropy(("0" + "1" * 14) * (blocks // 32767 + 1))
    return head + dc + ac * num_ac_scans + b"\xff\xd9"


def url(data: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


def test_a_jpeg_of_many_scans_is_refused_before_decoding(monkeypatch):
    from PIL import ImageFile

    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: loads.append(image.size) or real_load(image))
    bomb = empty_scans_jpeg(64, 64, MAX_JPEG_SCANS)  # one DC scan more than the bound
    with pytest.raises(ImageRejected, match=f"JPEG image has more than {MAX_JPEG_SCANS} scans"):
        decode_image_urls([url(bomb)], LIMITS)
    assert loads == []
    (decoded,) = decode_image_urls([url(empty_scans_jpeg(64, 64, MAX_JPEG_SCANS - 1))], LIMITS)
    assert decoded.image.size == (64, 64) and loads == [(64, 64)]


def _saved(image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, **options)
    return out.getvalue()


def test_encoders_jpegs_and_embedded_thumbnails_are_counted_as_libjpeg_reads_them():
    """Progressive, restart-marked and CMYK JPEGs count their own scans only; scans inside an APP1
    segment (an EXIF thumbnail) and an MPO's later frames are not the decoded stream's."""
    image = PIL.linear_gradient("L").resize((120, 80)).convert("RGB")
    progressive = _saved(image, format="JPEG", progressive=True)
    assert decode_module._jpeg_scan_count(progressive) == 10
    assert decode_module._jpeg_scan_count(_saved(image, format="JPEG", progressive=True,
                                                 restart_marker_blocks=1)) == 10
    assert decode_module._jpeg_scan_count(_saved(image.convert("CMYK"), format="JPEG", progressive=True)) == 18
    thumbnail = b"Exif\0\0" + empty_scans_jpeg(8, 8, 2 * MAX_JPEG_SCANS)
    with_thumbnail = progressive[:2] + _segment(0xE1, thumbnail) + progressive[2:]
    assert decode_module._jpeg_scan_count(with_thumbnail) == 10
    assert decode_image_urls([url(with_thumbnail)], LIMITS)[0].image.size == (120, 80)
    mpo = _saved(image, format="MPO", save_all=True, append_images=[image] * 3)
    assert decode_module._jpeg_scan_count(mpo) == 1
