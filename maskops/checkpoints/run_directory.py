"""A training results directory's checkpoints: their names, the newest, the best, and the
model file a ``-m`` argument names (:func:`resolve_model_path`, what evaluate, inference,
export and prune open).

Files are ``model.step-N.pth`` (TAO's ``model.step-N`` naming) and ``model.best.pth``, in the
maskops checkpoint format (:mod:`maskops.checkpoints.model_file`).
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^model\.step-(\d+)\.pth$")


BEST_NAME = "model.best.pth"
"""The best checkpoint by the validation metric (see BestCheckpointHook): weights only."""


CHOICES = ("best", "latest")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"model.step-{step}.pth"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every training checkpoint in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(directory: Path) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def resolve_model_path(path: Path) -> Path:
    """The model file a ``-m`` argument names: ``RESULTS_DIR/best`` or
    ``RESULTS_DIR/latest`` (a training results directory and a choice) the best or newest
    checkpoint in it; a bare ``RESULTS_DIR`` its best, or its newest when no best was kept.
    Anything else (a model file, or a path that does not exist) is returned unchanged, for
    the loader to open or to report.

    Raises:
        FileNotFoundError: the results directory holds no such checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        directory, choice = path, "best" if (path / BEST_NAME).is_file() else "latest"
    elif path.name in CHOICES and not path.exists() and path.parent.is_dir():
        directory, choice = path.parent, path.name
    else:
        return path
    found = directory / BEST_NAME if choice == "best" else latest_checkpoint(directory)
    if found is None or not found.is_file():
        what = BEST_NAME if choice == "best" else "model.step-N.pth checkpoint"
        raise FileNotFoundError(f"{directory}: no {what} (is it a training results directory?)")
    return found
