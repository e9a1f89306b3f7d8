"""What a service's extra of pyproject.toml installs, read from the installed metadata.

The development virtualenv holds every extra. To run a service as its image would, a test
either builds a virtualenv from exactly its extra (:func:`build_extra_venv`, the API) or
blocks, in the service's process, every module that its extra does not install
(:func:`guard_env`, the workers, whose torch would take minutes to install again).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
GUARD_DIR = Path(__file__).with_name("import_guard")
BLOCKED_ENV = "MASKOPS_TEST_BLOCKED_MODULES"
PROJECT = "maskops"

OWN_PACKAGES = {
    "api": {"maskops_worker"},
    "worker": {"maskops_api"},
    # The served models are copied into the model repository with their one helper file.
    "triton": {"maskops", "maskops_api", "maskops_core", "maskops_worker"},
}
"""The project's own packages a service must not import (they ship in one wheel)."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions_of(extras: set[str], project: str = PROJECT) -> set[str]:
    """Normalised names of every distribution ``project[extras]`` pulls in, itself included."""
    seen: set[str] = set()
    pending: list[tuple[str, frozenset[str]]] = [(project, frozenset(extras))]
    visited: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in visited:
            continue
        visited.add((name, wanted))
        seen.add(_normal(name))
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({"extra": extra}) for extra in {"", *wanted}
            ):
                continue
            pending.append((requirement.name, frozenset(requirement.extras)))
    return seen


def modules_outside(extra: str) -> set[str]:
    """Top-level modules installed here that ``maskops[extra]`` would not install."""
    allowed = distributions_of({extra})
    blocked = {
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(_normal(d) in allowed for d in dists)
    }
    return (blocked - {PROJECT}) | OWN_PACKAGES.get(extra, set())


def guard_env(extra: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a Python process that may import only what ``extra`` installs."""
    guarded = dict(env)
    guarded[BLOCKED_ENV] = ",".join(sorted(modules_outside(extra)))
    guarded["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(GUARD_DIR), env.get("PYTHONPATH", "")) if p
    )
    return guarded


def build_extra_venv(extra: str, where: Path) -> Path:
    """A virtualenv with exactly ``maskops[extra]`` (``services/install-extra``, as the
    image's Dockerfile runs it); returns its python. Its dependencies are reused while the
    lock and pyproject.toml are unchanged; the project itself is installed afresh."""
    locks = ("requirements.lock", "pyproject.toml")
    stamp_source = b"".join((REPO / name).read_bytes() for name in locks)
    stamp = where / f".deps-{hashlib.sha256(stamp_source).hexdigest()[:16]}"
    python = where / "bin" / "python"
    if not stamp.exists():
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
        pip = f"{python} -m pip --quiet --disable-pip-version-check"
        subprocess.run([str(REPO / "services" / "install-extra"), extra, pip], check=True)
        stamp.touch()
    else:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--force-reinstall", str(REPO)],
            check=True,
        )  # fmt: skip
    return python
