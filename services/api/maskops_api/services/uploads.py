"""Safe extraction of an uploaded dataset archive (zip or tar, optionally compressed).

Rejected: members with absolute paths or ``..``, links of any kind, devices, more than
``MAX_MEMBERS`` members, paths deeper than ``MAX_DEPTH`` folders or longer than
``MAX_PATH_BYTES`` (a 1,100-level tree overflowed Python's recursion in every tool that
walks it), encrypted zip members or ones compressed by a method zipfile does not read
(``ZIP_METHODS``), and archive bombs of every format. The bytes written are counted
as they are written (never trusted from headers) against one budget: ``max_bytes`` in
total, and at most ``max_ratio`` times the archive's own size (a few KB of bzip2 can
expand to gigabytes of zeros), with ``RATIO_FLOOR`` as the least any archive may expand
to. Zip members whose headers already declare a ratio above ``max_ratio`` are refused
before reading them. Extraction goes to a fresh folder that is removed again on any
rejection, so nothing of a refused archive stays on disk.
"""

from __future__ import annotations

import contextlib
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from maskops.path_rules import leaves_by_text
from maskops_core.paths import DISK_FULL_ERRNOS, remove_tree

MAX_MEMBERS = 200_000
MAX_RATIO = 200
MAX_DEPTH = 32
"""Folders a member may be nested in (COCO layouts need three or four)."""
MAX_PATH_BYTES = 1024
"""A member's path, UTF-8 (Linux allows 4096 for the whole path under the data root)."""
RATIO_FLOOR = 1024 * 1024
"""Small archives may always expand to this much (a tiny zip of one COCO JSON compresses
better than ``MAX_RATIO`` without being a bomb)."""
CHUNK = 1024 * 1024
ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
"""The zip compression methods Python's zipfile decompresses."""
_ZIP_ENCRYPTED = 0x1
"""General-purpose flag bit 0: the member is encrypted."""


class UnsafeArchive(ValueError):
    """The archive cannot be extracted safely; the message names the member."""


class TooLargeArchive(UnsafeArchive):
    """The archive expands beyond the size or compression-ratio limit (answered 413)."""


@dataclass
class _Budget:
    """Bytes still allowed to be written, and which limit runs out first."""

    left: int
    reason: str

    @classmethod
    def of(cls, archive_size: int, *, max_bytes: int, max_ratio: int) -> _Budget:
        by_ratio = max(archive_size * max_ratio, RATIO_FLOOR)
        if by_ratio < max_bytes:
            return cls(by_ratio, f"compression ratio above {max_ratio}:1")
        return cls(max_bytes, f"beyond the size limit of {max_bytes} bytes")

    def spend(self, size: int, name: str) -> None:
        self.left -= size
        if self.left < 0:
            raise TooLargeArchive(f"member {name!r}: archive expands {self.reason}")


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if leaves_by_text(name):
        raise UnsafeArchive(f"member {name!r}: path leaves the archive")
    if len(path.parts) > MAX_DEPTH or len(name.encode()) > MAX_PATH_BYTES:
        raise UnsafeArchive(
            f"member {name[:80]!r}...: path deeper than {MAX_DEPTH} folders or longer than "
            f"{MAX_PATH_BYTES} bytes"
        )
    return path


def _copy(source: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        while chunk := source.read(CHUNK):
            # Counted before writing: the limit is never overshot on disk.
            budget.spend(len(chunk), name)
            out.write(chunk)


def _extract_zip(archive: zipfile.ZipFile, dest: Path, budget: _Budget, max_ratio: int) -> None:
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise UnsafeArchive(f"archive has {len(members)} members (limit {MAX_MEMBERS})")
    for info in members:
        path = _safe_name(info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise UnsafeArchive(f"member {info.filename!r}: links are not allowed")
        if info.is_dir():
            (dest / path).mkdir(parents=True, exist_ok=True)
            continue
        if info.compress_size and info.file_size / info.compress_size > max_ratio:
            raise TooLargeArchive(f"member {info.filename!r}: compression ratio too high")
        _check_readable(info)
        with archive.open(info) as source:
            _copy(source, dest / path, budget, info.filename)


def _check_readable(info: zipfile.ZipInfo) -> None:
    """Refuse a member zipfile cannot read (it raises RuntimeError or NotImplementedError,
    which are no corrupt-archive errors), naming it."""
    if info.flag_bits & _ZIP_ENCRYPTED:
        raise UnsafeArchive(f"member {info.filename!r}: encrypted (no password is taken)")
    if info.compress_type not in ZIP_METHODS:
        raise UnsafeArchive(
            f"member {info.filename!r}: compression method {info.compress_type} is not "
            "supported (stored, deflate, bzip2 or lzma)"
        )


def _extract_tar(archive: tarfile.TarFile, dest: Path, budget: _Budget) -> None:
    count = 0
    for member in archive:
        count += 1
        if count > MAX_MEMBERS:
            raise UnsafeArchive(f"archive has more than {MAX_MEMBERS} members")
        path = _safe_name(member.name)
        if member.isdir():
            (dest / path).mkdir(parents=True, exist_ok=True)
            continue
        if not member.isfile():
            raise UnsafeArchive(f"member {member.name!r}: only files and folders are allowed")
        source = archive.extractfile(member)
        if source is None:
            raise UnsafeArchive(f"member {member.name!r}: unreadable")
        with source:
            _copy(source, dest / path, budget, member.name)


def extract_archive(
    archive_path: Path, dest: Path, *, max_bytes: int, max_ratio: int = MAX_RATIO
) -> None:
    """Extract a zip/tar(.gz/.bz2/.xz) into ``dest`` (created; must not exist)."""
    budget = _Budget.of(archive_path.stat().st_size, max_bytes=max_bytes, max_ratio=max_ratio)
    dest.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive_path):
            with zipfile.ZipFile(archive_path) as archive:
                _extract_zip(archive, dest, budget, max_ratio)
        elif tarfile.is_tarfile(archive_path):
            with tarfile.open(archive_path, mode="r:*") as archive:
                _extract_tar(archive, dest, budget)
        else:
            raise UnsafeArchive("the upload is not a zip or tar archive")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            remove_tree(dest)
        if isinstance(exc, UnsafeArchive) or (
            isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS
        ):
            raise  # a full disk is the server's problem, not a corrupt archive (507)
        # lzma/zlib errors are ValueError/OSError subclasses; an OSError's text may name a
        # server path, its strerror does not.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UnsafeArchive(f"corrupt archive: {reason}") from None
    except BaseException:
        # Whatever stopped the extraction, nothing of a refused archive stays on disk.
        with contextlib.suppress(OSError):
            remove_tree(dest)
        raise
