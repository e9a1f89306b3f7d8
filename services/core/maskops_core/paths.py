"""The rule for paths that arrive over REST: they name files under the data root.

A job's options and an experiment's spec are written by API clients, so a path in them must
not reach the rest of the server's filesystem (any readable checkpoint could otherwise be
exported and downloaded, and errors would reveal which files exist). The API checks them at
the door (422 naming the field); the command line, run by the machine's own user, keeps
taking any local path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

RELATIVE_PATH_PATTERN = (
    r"^(?![/\\])"  # not absolute
    r"(?!(?:\.?[/\\])*\.?$)"  # not empty once "." and "/" are dropped
    r"(?!(?:[^\x00]*[/\\])?\.\.(?:[/\\]|$))"  # no ".." part
    r"[^\x00:]+$"  # no NUL, no drive letter (nor any ":")
)
""":func:`relative_data_path`'s rule as a JSON Schema pattern (for the OpenAPI document;
slightly stricter: no ``:`` anywhere)."""


def relative_data_path(value: str) -> str:
    """``value`` if it is relative to the data root and stays inside it; else ValueError."""
    path = PurePosixPath(value.replace("\\", "/"))
    parts = path.parts
    if "\x00" in value or not parts or path.is_absolute() or ".." in parts or ":" in parts[0]:
        raise ValueError("must be a path relative to the data root without '..'")
    return value


def check_client_path(value: str, *, allowed_dirs: Sequence[Path] = ()) -> None:
    """A path from a client: relative to the data root, or absolute inside one of the
    operator's ``allowed_dirs`` (pretrained weights); ValueError saying which it must be."""
    if PurePosixPath(value).is_absolute() and "\x00" not in value:
        resolved = Path(value).resolve()
        if any(resolved.is_relative_to(Path(d).resolve()) for d in allowed_dirs):
            return
        allowed = " or inside " + ", ".join(str(d) for d in allowed_dirs) if allowed_dirs else ""
        raise ValueError(f"must be a path relative to the data root{allowed}")
    relative_data_path(value)
