"""Files that a killed process leaves under the data root, removed when the stack starts.

An upload spools its archive to ``uploads/tmp*.part`` (removed when the request ends, but
not when the API process is killed), and every atomic write (shards of an import,
checkpoints, manifests) goes through a hidden temporary next to its target
(:func:`maskops.atomic.temporary_sibling`) that a killed writer never renames. Nothing
reads either; only a start with no other process on the data root may remove them
(``maskops serve``, which holds its state dir's lock), since a running writer's
temporary looks the same.
"""

from __future__ import annotations

from pathlib import Path

from maskops.atomic import is_temporary

UPLOAD_SPOOL_PREFIX = "tmp"
UPLOAD_SPOOL_SUFFIX = ".part"
"""An upload's spooled archive: ``uploads/<prefix>*<suffix>``."""


def leftovers(data_root: Path) -> list[Path]:
    """The upload spools and atomic-write temporaries under ``data_root``."""
    uploads = data_root / "uploads"
    found = sorted(uploads.glob(f"{UPLOAD_SPOOL_PREFIX}*{UPLOAD_SPOOL_SUFFIX}"))
    found += sorted(
        path for path in data_root.rglob(".*.tmp") if is_temporary(path.name) and path.is_file()
    )
    return found


def sweep(data_root: Path) -> list[Path]:
    """Remove :func:`leftovers` (only with nothing else writing under ``data_root``);
    returns what was removed."""
    removed = []
    for path in leftovers(data_root):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
