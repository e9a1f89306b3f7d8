"""Label Studio's brush masks: its own run-length encoding of the RGBA image, both ways.

A ``brushlabels`` region carries ``value: {"format": "rle", "rle": [int, ...]}``: the bytes
of a bit stream (most significant bit first) written by the ``encode`` of thi.ng's
``@thi.ng/rle-pack`` (umbrella/packages/rle-pack/src/index.ts), which Label Studio's
editor uses, and by ``encode_rle`` of ``label_studio_converter/brush.py`` (now
``label_studio_sdk/converter/brush.py``), which this module follows:

    header    32 bits: number of values n; 5 bits: word size - 1; 4 x 4 bits: the four
              run-length field sizes - 1 (Label Studio writes 8 and 3, 4, 8, 16)
    chunk     1 bit: repeat; 2 bits: which run-length field; that field: run length - 1;
              then one word repeated run-length times (repeat 1), or run-length words
              (repeat 0); chunks follow until n values are out, zero bits pad the last byte

The values are the image's RGBA bytes, row by row (width x height x 4); Label Studio's
converter takes the alpha channel as the mask, and so does :func:`to_mask`. numpy only:
label-studio-sdk does not install against this project's numpy (docs/data-loop.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from maskops.data.limits import MAX_PIXELS

WORD_SIZE = 8
RUN_FIELDS = (3, 4, 8, 16)
"""The field sizes Label Studio writes (the reader takes whatever the header says)."""


class _Bits:
    """Reads unsigned fields from a bit string (``"0101..."``, ``int(s, 2)`` is fast)."""

    def __init__(self, data: Sequence[int]) -> None:
        array = np.asarray(data)
        if array.size == 0 or array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError("rle must be a non-empty list of integers")
        if array.min() < 0 or array.max() > 255:
            raise ValueError("rle must be bytes (integers 0..255)")
        self.bits = (np.unpackbits(array.astype(np.uint8)) + ord("0")).tobytes().decode()
        self.at = 0

    def read(self, size: int) -> int:
        end = self.at + size
        if end > len(self.bits):
            raise ValueError(f"rle ends inside a field (bit {self.at} of {len(self.bits)})")
        value = int(self.bits[self.at : end], 2)
        self.at = end
        return value


def decode(rle: Sequence[int], expected: int | None = None) -> np.ndarray:
    """The values ``rle`` encodes (``uint8``, or wider for word sizes over 8 bits).

    Raises:
        ValueError: not bytes, a stream that ends early or runs past its length, or a
            length other than ``expected``.
    """
    bits = _Bits(rle)
    count = bits.read(32)
    if expected is not None and count != expected:
        raise ValueError(f"rle holds {count} values, expected {expected}")
    word = bits.read(5) + 1
    fields = [bits.read(4) + 1 for _ in range(4)]
    out = np.zeros(count, dtype=np.uint8 if word <= 8 else np.uint32)
    i = 0
    while i < count:
        repeat = bits.read(1)
        end = i + 1 + bits.read(fields[bits.read(2)])
        if end > count:
            raise ValueError(f"a run ends at value {end}, past the {count} declared")
        if repeat:
            out[i:end] = bits.read(word)
        else:
            out[i:end] = [bits.read(word) for _ in range(end - i)]
        i = end
    return out


def encode(values: np.ndarray) -> list[int]:
    """``values`` (integers 0..255) as Label Studio writes them: word size 8, run fields
    3, 4, 8, 16 bits, byte for byte what label-studio-sdk's ``encode_rle`` gives."""
    flat = np.asarray(values).ravel()
    if flat.size and (flat.min() < 0 or flat.max() > 255):
        raise ValueError("values must be bytes (0..255)")
    header = f"{flat.size:032b}{WORD_SIZE - 1:05b}" + "".join(f"{f - 1:04b}" for f in RUN_FIELDS)
    chunks = [header]
    if flat.size:
        starts = np.concatenate(([0], np.flatnonzero(np.diff(flat)) + 1))
        lengths = np.diff(np.append(starts, flat.size))
        values = flat[starts]
        chunks += [_run(n, v) for n, v in zip(lengths.tolist(), values.tolist(), strict=True)]
    stream = "".join(chunks)
    stream += "0" * (8 - len(stream) % 8)  # as encode_rle: a whole zero byte when aligned
    return [int(stream[k : k + 8], 2) for k in range(0, len(stream), 8)]


def _run(length: int, value: int) -> str:
    """One run of ``length`` equal values (a single value is a literal of one)."""
    word = f"{value:08b}"
    if length == 1:
        return "0" + "00" + "000" + word
    for index, size in enumerate(RUN_FIELDS[:-1]):
        if length <= 2**size:
            return "1" + f"{index:02b}" + f"{length - 1:0{size}b}" + word
    out = []
    while length > 2**16:  # the widest field counts 2**16 values; the rest goes in it too
        out.append("1" + "11" + f"{2**16 - 1:016b}" + word)
        length -= 2**16
    return "".join(out) + "1" + "11" + f"{length - 1:016b}" + word


def to_mask(rle: Sequence[int], width: int, height: int) -> np.ndarray:
    """A brush region's mask, ``bool`` height x width: the pixels whose alpha is not 0.

    Raises:
        ValueError: a size out of range, or ``rle`` not an RGBA image of that size.
    """
    if not (width > 0 and height > 0 and width * height <= MAX_PIXELS):
        raise ValueError(f"image size {width} x {height} out of range")
    rgba = decode(rle, expected=width * height * 4).reshape(height, width, 4)
    return rgba[:, :, 3] != 0


def from_mask(mask: np.ndarray) -> list[int]:
    """A binary mask (height x width) as a brush region's ``rle``: every channel 255 in
    the mask, 0 elsewhere (label-studio-sdk's ``mask2rle`` of the mask times 255)."""
    return encode(np.repeat(np.asarray(mask, dtype=bool).ravel() * np.uint8(255), 4))
