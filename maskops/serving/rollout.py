"""Publish a version and serve it on every Triton replica, all or nothing.

The one sequence the publish job and ``maskops publish --triton_url`` share: the version
is written, loaded on every replica (inside the publish, so that a replica which cannot
load it makes the publish undo itself) and, on failure, what the repository holds again
is loaded back everywhere, since a replica may have unloaded the serving version of a part
whose new version failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from maskops.serving.replicas import Rollout, roll_out_all
from maskops.serving.repository import publish
from maskops.serving.versions import existing_versions


class RolloutFailed(Exception):
    """A replica did not serve the new version: it was undone; the message says per
    replica what happened and whether the earlier version serves again."""


def publish_and_roll_out(
    export: Path,
    repository: Path,
    name: str,
    replicas: Sequence[str],
    *,
    log: Callable[[str], None] = print,
    **publish_options: Any,
) -> tuple[int, Rollout | None]:
    """:func:`~maskops.serving.repository.publish`, then serve the version on ``replicas``.

    Returns the version and how each replica took it (None without replicas).

    Raises:
        PublishError: the export cannot be published (nothing was written).
        RolloutFailed: a replica could not load it (the repository is as it was).
    """
    rollout: Rollout | None = None

    def load(version: int) -> None:
        nonlocal rollout
        log(f"wrote {name} version {version}; loading it on {', '.join(replicas)}")
        rollout = roll_out_all(replicas, name, version)
        log(rollout.summary())
        if rollout.failed:
            raise RolloutFailed(
                f"Triton did not load {name} version {version} on every replica "
                f"({rollout.summary()}); the repository is as it was before"
            )

    activate = load if replicas else None
    try:
        version = publish(export, repository, name, activate=activate, **publish_options)
    except RolloutFailed as failed:
        raise RolloutFailed(f"{failed}. {_restore(repository, name, replicas)}") from None
    return version, rollout


def _restore(repository: Path, name: str, replicas: Sequence[str]) -> str:
    """Load the newest version the repository holds on every replica; a sentence."""
    versions = existing_versions(repository, name)
    if not versions:
        return "No earlier version exists."
    rollout = roll_out_all(replicas, name, versions[-1])
    if rollout.failed:
        return f"Reloading version {versions[-1]}: {rollout.summary()}"
    return f"Version {versions[-1]} serves again on every replica."
