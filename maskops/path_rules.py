"""The rule for a path a client names: it stays inside the folder it is joined to.

Client-given paths (job options, dataset splits, archive members, the image names of an
annotation file, an artifact's name in a URL) are joined to a folder the server chose: the
data root, an image directory, an upload's folder, a job's folder. Two checks keep them
there:

- :func:`leaves_by_text`, on the text alone: a NUL, an absolute path (``/`` or ``\\``), a
  ``..`` part, a drive letter (``C:``). Refused before anything is looked up, so the answer
  does not tell which files exist;
- :func:`confine`: that, then the joined path with its links followed must still be inside
  the folder (a link inside the data root pointing out of it is refused too).

Standard library only: the engine's readers and the control plane's core apply the same
rule.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class PathEscape(ValueError):
    """A client-given path that leaves the folder it is joined to."""


def leaves_by_text(name: str) -> bool:
    """Whether ``name`` can leave any folder it is joined to, judged on its text alone
    (``\\`` counts as ``/``): a NUL, absolute, a ``..`` part, or a drive letter (any ``:``
    in its first part). The empty name does not leave (it is the folder itself)."""
    path = PurePosixPath(name.replace("\\", "/"))
    parts = path.parts
    return "\x00" in name or path.is_absolute() or ".." in parts or bool(parts and ":" in parts[0])


def is_inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or under it, the links of both followed; OSError or
    RuntimeError for a link loop (or a path too long to resolve)."""
    return path.resolve().is_relative_to(folder.resolve())


def confine(folder: Path, name: str) -> Path:
    """``folder / name`` with its links followed (absolute), when that stays inside
    ``folder``; :class:`PathEscape` when ``name`` leaves it, by its text
    (:func:`leaves_by_text`) or through a link. OSError or RuntimeError for a link loop."""
    if leaves_by_text(name):
        raise PathEscape(f"{name!r} is not a relative path without '..'")
    root = folder.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise PathEscape(f"{name!r} leaves its folder through a link")
    return path
