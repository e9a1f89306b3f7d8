"""The rule for paths that arrive over REST: they name files under the data root.

A job's options and an experiment's spec are written by API clients, so a path in them must
not reach the rest of the server's filesystem (any readable checkpoint could otherwise be
exported and downloaded, and errors would reveal which files exist). The API checks them at
the door (422 naming the field); the command line, run by the machine's own user, keeps
taking any local path.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from maskops.path_rules import is_inside, leaves_by_text

RELATIVE_PATH_PATTERN = (
    r"^(?![/\\])"  # not absolute
    r"(?!(?:\.?[/\\])*\.?$)"  # not empty once "." and "/" are dropped
    r"(?!(?:[^\x00]*[/\\])?\.\.(?:[/\\]|$))"  # no ".." part
    r"[^\x00:]+$"  # no NUL, no drive letter (nor any ":")
)
""":func:`relative_data_path`'s rule as a JSON Schema pattern (for the OpenAPI document;
slightly stricter: no ``:`` anywhere)."""


def relative_data_path(value: str) -> str:
    """``value`` if it is relative to the data root and stays inside it by its text
    (:func:`maskops.path_rules.leaves_by_text`; not empty); else ValueError."""
    if not PurePosixPath(value.replace("\\", "/")).parts or leaves_by_text(value):
        raise ValueError("must be a path relative to the data root without '..'")
    return value


def check_client_path(value: str, *, allowed_dirs: Sequence[Path] = ()) -> None:
    """A path from a client: relative to the data root, or absolute inside one of the
    operator's ``allowed_dirs`` (pretrained weights); ValueError saying which it must be."""
    if PurePosixPath(value).is_absolute() and "\x00" not in value:
        if any(is_inside(Path(value), Path(d)) for d in allowed_dirs):
            return
        allowed = " or inside " + ", ".join(str(d) for d in allowed_dirs) if allowed_dirs else ""
        raise ValueError(f"must be a path relative to the data root{allowed}")
    relative_data_path(value)


def relative_to_root(text: str, root: Path) -> str:
    """``text`` with every absolute path under ``root`` written relative to it
    (``/srv/maskops/data/jobs/3/x.pth`` -> ``jobs/3/x.pth``; the root itself -> ``.``):
    job errors and logs, which API clients read, never show where the server keeps its
    data (the paths clients send are relative to the data root too)."""
    for prefix in sorted({str(root.absolute()), str(root.resolve())}, key=len, reverse=True):
        pattern = re.escape(prefix.rstrip("/")) + r"(?:/|(?![\w.-]))"
        text = re.sub(pattern, lambda m: "" if m.group(0).endswith("/") else ".", text)
    return text


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""``OSError.errno`` of a write refused for lack of space (the disk, or a quota)."""


def free_bytes(path: Path) -> int:
    """Free bytes (for unprivileged writers) on the file system holding ``path``, or its
    nearest existing parent."""
    for folder in (path, *path.absolute().parents):
        try:
            return shutil.disk_usage(folder).free
        except FileNotFoundError:
            continue
    return shutil.disk_usage("/").free


def disk_problem(data_root: Path, min_free: int) -> str:
    """ "ok", or what ``/readyz`` and a 507 say about the data root's disk."""
    free = free_bytes(data_root)
    if free >= min_free:
        return "ok"
    return (
        f"the data root's disk (MASKOPS_DATA_ROOT) has {free // 1024**2} MiB free, "
        f"below MASKOPS_MIN_FREE_DISK_BYTES ({min_free // 1024**2} MiB)"
    )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it; a missing path is no error.

    Unlike ``shutil.rmtree`` (recursive in Python 3.11: ``RecursionError`` past about 1,000
    levels, and paths past ``PATH_MAX`` fail), this walks down and up one directory at a
    time, each opened relative to the one before: at most two descriptors open, no path
    longer than one name, any depth. Links inside are removed, never followed; ``path``
    itself being a link raises ``OSError``, as with ``shutil.rmtree``.
    """
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):  # as shutil.rmtree: a link in place of the folder is odd
            raise OSError(errno.ELOOP, "a symbolic link, not a folder", str(path))
        if not stat.S_ISDIR(mode):
            path.unlink()
            return
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    names: list[str] = []  # the directories entered below ``path``, outermost first
    try:
        while True:
            child = _first_subdir_after_unlinking_files(fd)
            if child is not None:
                inner = os.open(child, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd, names = inner, [*names, child]
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    path.rmdir()


def _first_subdir_after_unlinking_files(fd: int) -> str | None:
    """Unlink every non-directory in the directory ``fd``; the name of a subdirectory left,
    if any."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            os.unlink(entry.name, dir_fd=fd)
    return None
