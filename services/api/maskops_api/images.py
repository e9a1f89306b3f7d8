"""An image's format and size from its first bytes (stdlib only: the API has no Pillow).

Enough to refuse at the door what the model server would refuse later, or choke on: a
format other than JPEG/PNG, or dimensions that would decode to gigabytes (a PNG of
100000 x 100000 pixels compresses to a few MB of zeros).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
# Start-of-frame markers carry the dimensions; C4 (DHT), C8 (JPG) and CC (DAC) do not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_OTHER_FORMATS = {
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"RIFF": "WebP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


class ImageError(ValueError):
    """The bytes are not a usable image; the message says why (never the bytes)."""


class UnsupportedFormat(ImageError):
    pass


@dataclass(frozen=True)
class ImageHeader:
    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def read_header(data: bytes) -> ImageHeader:
    """The format and dimensions of a JPEG or PNG; raises :class:`ImageError`."""
    if data.startswith(PNG_SIGNATURE):
        return _png(data)
    if data.startswith(JPEG_SIGNATURE):
        return _jpeg(data)
    for magic, name in _OTHER_FORMATS.items():
        if data.startswith(magic):
            raise UnsupportedFormat(f"{name} images are not supported (JPEG or PNG only)")
    raise UnsupportedFormat("not a JPEG or PNG image")


def _png(data: bytes) -> ImageHeader:
    # The IHDR chunk comes first: length, b"IHDR", width, height (big-endian).
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ImageError("corrupt PNG: no IHDR header")
    width, height = struct.unpack(">II", data[16:24])
    return _sized("PNG", width, height)


def _jpeg(data: bytes) -> ImageHeader:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ImageError("corrupt JPEG: expected a marker")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image or scan data before any frame header
            break
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF_MARKERS:
            if i + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return _sized("JPEG", width, height)
        if length < 2:
            raise ImageError("corrupt JPEG: bad segment length")
        i += 2 + length
    raise ImageError("corrupt JPEG: no frame header")


def _sized(kind: str, width: int, height: int) -> ImageHeader:
    if width == 0 or height == 0:
        raise ImageError(f"corrupt {kind}: {width} x {height} pixels")
    return ImageHeader(kind, width, height)
