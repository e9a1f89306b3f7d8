"""The shard format: what ``dataset_convert`` writes and the training pipeline reads.

A shard is a plain POSIX tar file (WebDataset layout) named ``<tag>-NNNNN-of-MMMMM.tar``.
Each sample is two members with the same key: ``<key>.json``, a compact record (image id,
file name, size, annotations with clipped xywh boxes, category ids, contiguous labels,
crowd flags, and each mask as the COCO compressed-RLE string of the mask cropped to its
own bounding box ``mask_box``), and ``<key>.jpg``/``<key>.png``, the encoded image bytes,
untouched from the source when the source was already usable.

Why this format: reading a sample is one seek and two reads of bytes that are already in
their final encoding; there is no per-sample JSON index of the whole dataset, no polygon
rasterisation (RLE decodes an order of magnitude faster) and no image re-encoding. Tar
needs no new dependency, box-cropped masks decode and resize in time proportional to the
object rather than the image, streams on write (peak memory is one sample), can be inspected
with ``tar tf``, and its member headers give the byte offsets that random access needs
(:func:`index_shard` scans only the 512-byte headers). Keys are the sample's position in
the conversion (zero-padded), so a shard's members sort in sample order.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from maskops.atomic import commit, temporary_sibling

SHARD_EXTENSION = "tar"
SHARD_NAME_RE = re.compile(r"^(?P<tag>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tar$")
IMAGE_EXTENSIONS = {"jpeg": "jpg", "png": "png"}


def shard_name(tag: str, index: int, count: int) -> str:
    """TAO-style shard file name: ``<tag>-NNNNN-of-MMMMM.tar``."""
    return f"{tag}-{index:05d}-of-{count:05d}.{SHARD_EXTENSION}"


def is_shard_file(path: Path | str) -> bool:
    """Whether a file name is a shard (a pattern like ``train*`` also selects manifests)."""
    return SHARD_NAME_RE.match(Path(path).name) is not None


@dataclass(frozen=True)
class SampleLocation:
    """Where one sample's two members lie inside a shard (byte offsets of their data)."""

    shard: int
    record_offset: int
    record_size: int
    image_offset: int
    image_size: int


@dataclass(frozen=True)
class Sample:
    """A decoded shard record plus the still-encoded image bytes."""

    record: dict[str, Any]
    image_bytes: bytes


class ShardWriter:
    """Writes samples into one shard; the file appears under its final name only on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._partial = temporary_sibling(path)
        self._file = self._partial.open("wb")
        # The writer owns both handles until close()/abort(); no context manager fits.
        self._tar = tarfile.open(  # noqa: SIM115
            fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT
        )
        self.num_samples = 0

    def write(
        self, key: str, record: dict[str, Any], image_bytes: bytes, image_format: str
    ) -> None:
        """Add one sample: ``record`` (JSON-serialisable) and its encoded image."""
        payload = json.dumps(record, separators=(",", ":")).encode()
        self._add(f"{key}.json", payload)
        self._add(f"{key}.{IMAGE_EXTENSIONS[image_format]}", image_bytes)
        self.num_samples += 1

    def _add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = 0  # identical inputs give byte-identical shards
        self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self._tar.close()
        self._file.close()
        commit(self._partial, self.path, durable=True)

    def abort(self) -> None:
        self._tar.close()
        self._file.close()
        self._partial.unlink(missing_ok=True)


def index_shard(path: Path, shard: int) -> list[SampleLocation]:
    """Locate every sample of a shard by scanning its tar headers (data is skipped).

    Raises:
        ValueError: the file is not a shard (naming which file and member).
    """
    pending: dict[str, tuple[int, int, int, int]] = {}
    locations: list[SampleLocation] = []
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                key, _, ext = member.name.rpartition(".")
                if not member.isfile() or not key:
                    raise ValueError(f"{path}: unexpected member {member.name!r}")
                rec = pending.setdefault(key, (-1, 0, -1, 0))
                if ext == "json":
                    rec = (member.offset_data, member.size, rec[2], rec[3])
                elif ext in IMAGE_EXTENSIONS.values():
                    rec = (rec[0], rec[1], member.offset_data, member.size)
                else:
                    raise ValueError(f"{path}: unexpected member {member.name!r}")
                if rec[0] >= 0 and rec[2] >= 0:
                    del pending[key]
                    locations.append(SampleLocation(shard, *rec))
                else:
                    pending[key] = rec
    except tarfile.TarError as exc:
        raise ValueError(f"{path}: not a readable shard: {exc}") from exc
    if pending:
        raise ValueError(f"{path}: incomplete samples {sorted(pending)[:5]}")
    return locations


class ShardReader:
    """Random access to samples by :class:`SampleLocation`; keeps its shard files open.

    One reader per process: file handles are opened lazily, so a reader created before a
    DataLoader forks its workers gets fresh handles in each worker.
    """

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._files: dict[int, BinaryIO] = {}
        self._pid = os.getpid()

    def read(self, location: SampleLocation) -> Sample:
        handle = self._handle(location.shard)
        handle.seek(location.record_offset)
        record = json.loads(handle.read(location.record_size))
        handle.seek(location.image_offset)
        return Sample(record=record, image_bytes=handle.read(location.image_size))

    def _handle(self, shard: int) -> BinaryIO:
        if self._pid != os.getpid():
            self._files, self._pid = {}, os.getpid()
        handle = self._files.get(shard)
        if handle is None:
            handle = self._files[shard] = self.paths[shard].open("rb")
        return handle

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["paths"])  # type: ignore[misc]


def iter_shard(path: Path) -> Iterator[Sample]:
    """Every sample of one shard, in order (sequential read)."""
    reader = ShardReader([path])
    try:
        for location in index_shard(path, 0):
            yield reader.read(location)
    finally:
        reader.close()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
