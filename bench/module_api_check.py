"""Every module-level name the sources use from torch, torchvision, numpy, onnx and
onnxruntime, looked up in the installed versions.

bench/rehearse_gpu_host runs it in the GPU image's Python: code that only a GPU runs (a
CUDA branch, a multi-rank group) is not executed by a CPU rehearsal, but what it names is
still checked here. Attributes of objects (a tensor's methods) are out of its reach.

    python bench/module_api_check.py maskops bench tests

Prints each missing name with where it is used, and exits 1 when there is one.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from types import ModuleType

LIBRARIES = ("torch", "torchvision", "numpy", "onnx", "onnxruntime")


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted path, for the imports of ``LIBRARIES`` in a module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in LIBRARIES:
                    names[alias.asname or root] = alias.name if alias.asname else root
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] in LIBRARIES
        ):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted_uses(tree: ast.AST, names: dict[str, str]) -> list[tuple[str, int]]:
    """Each ``name.attr.attr`` (and each imported name) as a dotted path, with its line."""
    uses = [(path, 0) for path in names.values()]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts: list[str] = []
        current: ast.expr = node
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id in names:
            uses.append((".".join([names[current.id], *reversed(parts)]), node.lineno))
    return uses


def missing_name(dotted: str) -> str | None:
    """The first prefix of ``dotted`` that a module lacks; None when it resolves (or leaves
    the modules: an attribute of a class or an object is not checked)."""
    parts = dotted.split(".")
    try:
        current: object = importlib.import_module(parts[0])
    except ImportError:
        return parts[0]
    for depth in range(1, len(parts)):
        if not isinstance(current, ModuleType):
            return None
        prefix = ".".join(parts[: depth + 1])
        if hasattr(current, parts[depth]):
            current = getattr(current, parts[depth])
            continue
        try:
            current = importlib.import_module(prefix)
        except ImportError:
            return prefix
    return None


def main(roots: list[str]) -> int:
    missing: dict[str, list[str]] = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for dotted, line in _dotted_uses(tree, _imported_names(tree)):
                name = missing_name(dotted)
                if name is not None:
                    missing.setdefault(name, []).append(f"{path}:{line}")
    for name, places in sorted(missing.items()):
        print(f"missing {name}: {', '.join(sorted(set(places))[:3])}")
    checked = ", ".join(f"{lib} {_version(lib)}" for lib in LIBRARIES)
    print(f"{len(missing)} missing name(s) against {checked}")
    return 1 if missing else 0


def _version(library: str) -> str:
    try:
        return str(getattr(importlib.import_module(library), "__version__", "?"))
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
