"""Version folders of a Triton model repository, and writing a new one all or nothing.

A model's versions are its numbered folders; a new version of an ensemble is one more than
any version folder of its four models (:func:`next_version`). The ensemble's folder holds
``versions.json``, the publish history (:func:`read_history`). :func:`write_version`
stages every version folder under a hidden name, moves them into place (the parts first,
the ensemble last), then replaces the configs; on any failure everything it did is undone,
so the repository is left byte for byte as it was.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from maskops.atomic import atomic_write
from maskops.serving.model_configs import PublishError
from maskops.serving.protocol import EnsembleNames

if TYPE_CHECKING:
    from maskops.export.graph import GraphMetadata

Content = str | Path
"""A version folder entry: text to write, or a file to copy."""


def existing_versions(repository: Path, name: str) -> list[int]:
    """Published versions of ``name`` (numbered folders of the ensemble), ascending."""
    return _numbered(Path(repository) / name)


def _numbered(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def next_version(repository: Path, names: EnsembleNames) -> int:
    """One more than any version folder of the four models.

    A part may hold a version its ensemble lacks (a publish killed between two moves, or
    by an older maskops): the new version must not land on it, and must be newer so that
    Triton's "latest" policy never picks the orphan.
    """
    return 1 + max([0, *(v for model in names.load_order for v in _numbered(repository / model))])


@dataclass
class _Changes:
    """What a publish did to the repository so far, so that a failure can undo all of it."""

    created: list[Path] = field(default_factory=list)
    """Folders this publish created (outermost first)."""
    moved: list[Path] = field(default_factory=list)
    """Version folders moved into place."""
    replaced: dict[Path, bytes | None] = field(default_factory=dict)
    """Files written, with their previous content (None: there was none)."""
    staging: list[Path] = field(default_factory=list)

    def make_dirs(self, folder: Path) -> None:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        for path in reversed(missing):
            path.mkdir()
            self.created.append(path)

    def stage(self, model_dir: Path, version: int, contents: dict[str, Content]) -> Path:
        """Write one version folder under a hidden staging name inside ``model_dir``."""
        self.make_dirs(model_dir)
        staging = model_dir / f".{version}.staging"
        # The version is new, so a folder of that name is a crashed publish's leftover.
        shutil.rmtree(staging, ignore_errors=True)
        self.staging.append(staging)
        staging.mkdir()
        for filename, content in contents.items():
            if isinstance(content, Path):
                shutil.copyfile(content, staging / filename)
            else:
                (staging / filename).write_text(content)
        return staging

    def move(self, staging: Path, final: Path) -> None:
        staging.rename(final)
        self.moved.append(final)

    def write(self, path: Path, text: str) -> None:
        if path not in self.replaced:
            self.replaced[path] = path.read_bytes() if path.is_file() else None
        atomic_write(path, text)

    def undo(self) -> None:
        """Put the repository back as it was (best effort: every step is attempted)."""
        for path, previous in self.replaced.items():
            with suppress(OSError):
                if previous is None:
                    path.unlink(missing_ok=True)
                else:
                    atomic_write(path, previous)
        for final in reversed(self.moved):
            shutil.rmtree(final, ignore_errors=True)
        self.remove_staging()
        for folder in reversed(self.created):
            shutil.rmtree(folder, ignore_errors=True)

    def remove_staging(self) -> None:
        for staging in self.staging:
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _all_or_nothing() -> Iterator[_Changes]:
    """Changes that are undone if the block raises; staging folders never outlive it."""
    changes = _Changes()
    try:
        yield changes
    except BaseException:
        changes.undo()
        raise
    finally:
        changes.remove_staging()


def read_history(path: Path) -> list[dict[str, object]]:
    """The ensemble's ``versions.json``, read before anything is written."""
    if not path.exists():
        return []
    try:
        history = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path}: unreadable publish history ({exc})") from None
    if not isinstance(history, list):
        raise PublishError(f"{path}: unreadable publish history (not a JSON list)")
    return history


def write_version(
    repository: Path,
    names: EnsembleNames,
    version: int,
    files: dict[str, dict[str, Content]],
    configs: dict[str, str],
    history: list[dict[str, object]],
    meta: GraphMetadata,
    activate: Callable[[int], None] | None,
) -> None:
    """Stage, move into place, write the configs, activate: all or nothing."""
    try:
        with _all_or_nothing() as changes:
            changes.make_dirs(repository)
            staged = {
                model: changes.stage(repository / model, version, contents)
                for model, contents in files.items()
            }
            # Parts first, the ensemble last: existing_versions reads the ensemble.
            for model, staging in staged.items():
                changes.move(staging, repository / model / str(version))
            for model, text in configs.items():
                changes.write(repository / model / "config.pbtxt", text)
            label_json = json.dumps(meta.label_map.to_json(), indent=1)
            changes.write(repository / names.name / "label_map.json", label_json)
            history_path = repository / names.name / "versions.json"
            changes.write(history_path, json.dumps(history, indent=1))
            if activate is not None:
                activate(version)
    except OSError as exc:
        raise PublishError(
            f"could not publish {names.name} version {version} into {repository}: {exc} "
            "(the repository is unchanged)"
        ) from None


def remove_leftover_staging(repository: Path, names: EnsembleNames) -> None:
    """Delete staging folders that crashed publishes of older versions left behind."""
    for model in names.load_order:
        for leftover in (repository / model).glob(".*.staging"):
            if leftover.name[1:].split(".")[0].isdigit():
                shutil.rmtree(leftover, ignore_errors=True)
