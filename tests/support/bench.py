"""The scripts under bench/ for tests: they are scripts, not a package (each imports its
neighbours, ``machine`` and ``timing``, by their bare names, as ``python bench/x.py`` does)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def load_bench_module(name: str) -> ModuleType:
    """Import ``bench/<name>.py`` as the module ``name``."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def run_bench(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> args...`` from the repository root; fails with its stderr."""
    process = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return process
