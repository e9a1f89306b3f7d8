"""Replacing a file in one step: a reader sees the old file or the whole new one, never half.

Every write that replaces a file other processes may read (checkpoints, status and metrics
JSON, manifests, shards, ONNX files, the Triton model repository, the embedded stack's
state) goes through here: the content is written to a hidden temporary file in the same
folder (:func:`temporary_sibling`, the one naming scheme, so that a rename never crosses a
file system) and renamed over the target; a failure leaves the target untouched and
removes the temporary file.

``durable=True`` also flushes the content and then the folder's entry to the disk (fsync),
so that a power loss after the call returns keeps the new file; it costs a disk round trip,
so it is for what cannot be rebuilt (checkpoints, shards, tokens), not for progress files
rewritten every few seconds.

This module imports the standard library only: the engine and the control plane
(``maskops_api``, which may import the engine's dependency-free modules) both use it.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_MODE = 0o666
"""Permissions of a new file before the umask, as ``open()`` creates it."""


def temporary_sibling(path: Path) -> Path:
    """A hidden, unique temporary name next to ``path`` (same folder, so same file system).

    The process id and a random part keep two processes or threads writing the same target
    apart; the leading dot keeps globs such as ``*.json`` from seeing the half-written file.
    """
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


_TEMPORARY_NAME = re.compile(r"^\..+\.\d+-[0-9a-f]{8}\.tmp$")


def is_temporary(name: str) -> bool:
    """Whether a file name is one :func:`temporary_sibling` makes (a writer killed before
    its rename leaves it behind)."""
    return _TEMPORARY_NAME.match(name) is not None


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on a normal exit it replaces ``path`` in one rename.

    For writers that want a file name (``onnx.save``, ``PIL.Image.save``, ``torch.save``).
    On an exception the temporary file is removed and ``path`` keeps its old content.
    """
    target = Path(path)
    tmp = temporary_sibling(target)
    try:
        yield tmp
        commit(tmp, target, durable=durable)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    durable: bool = False,
    mode: int = DEFAULT_MODE,
) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8) in one rename.

    ``mode``: the new file's permissions (before the umask), set when it is created, so a
    secret is never readable by others even for an instant. Returns ``path`` as a Path.
    """
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    with atomic_path(target, durable=durable) as tmp:
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
    return target


def commit(tmp: Path, target: Path, *, durable: bool = False) -> None:
    """Rename the finished ``tmp`` over ``target`` (for writers that keep the file open
    while they write, such as a shard's tar stream; they name it :func:`temporary_sibling`)."""
    if durable:
        _fsync_file(tmp)
    tmp.replace(target)
    if durable:
        _fsync_dir(target.parent)


def _fsync_file(path: Path) -> None:
    # fsync through a new descriptor flushes what any earlier descriptor wrote (Linux).
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the folder's entry is; not every OS can open a folder.
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
