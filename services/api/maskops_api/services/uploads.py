"""Safe extraction of an uploaded dataset archive (zip or tar, optionally compressed).

Rejected: members with absolute paths or ``..``, links of any kind, devices, more than
``MAX_MEMBERS`` members, more than ``max_bytes`` extracted in total (counted while writing,
not trusted from headers), and zip members compressed more than ``MAX_RATIO`` to one (zip
bombs). Extraction goes to a fresh folder that is removed again on any rejection.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO

MAX_MEMBERS = 200_000
MAX_RATIO = 200
CHUNK = 1024 * 1024


class UnsafeArchive(ValueError):
    """The archive cannot be extracted safely; the message names the member."""


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if (
        path.is_absolute()
        or ".." in path.parts
        or "\x00" in name
        or (path.parts and ":" in path.parts[0])
    ):
        raise UnsafeArchive(f"member {name!r}: path leaves the archive")
    return path


def _copy(source: IO[bytes], target: Path, budget: list[int], name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        while chunk := source.read(CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise UnsafeArchive(f"member {name!r}: archive expands beyond the size limit")
            out.write(chunk)


def _extract_zip(archive: zipfile.ZipFile, dest: Path, budget: list[int]) -> None:
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
        if info.compress_size and info.file_size / info.compress_size > MAX_RATIO:
            raise UnsafeArchive(f"member {info.filename!r}: compression ratio too high")
        with archive.open(info) as source:
            _copy(source, dest / path, budget, info.filename)


def _extract_tar(archive: tarfile.TarFile, dest: Path, budget: list[int]) -> None:
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


def extract_archive(archive_path: Path, dest: Path, *, max_bytes: int) -> None:
    """Extract a zip/tar(.gz/.bz2/.xz) into ``dest`` (created; must not exist)."""
    dest.mkdir(parents=True)
    budget = [max_bytes]
    try:
        if zipfile.is_zipfile(archive_path):
            with zipfile.ZipFile(archive_path) as archive:
                _extract_zip(archive, dest, budget)
        elif tarfile.is_tarfile(archive_path):
            with tarfile.open(archive_path, mode="r:*") as archive:
                _extract_tar(archive, dest, budget)
        else:
            raise UnsafeArchive("the upload is not a zip or tar archive")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise UnsafeArchive(f"corrupt archive: {exc}") from None
    except UnsafeArchive:
        shutil.rmtree(dest, ignore_errors=True)
        raise
