"""The import rules between the packages, and the action catalogue as the one list of actions.

- the engine (``maskops``) imports none of the control plane (``maskops_core``,
  ``maskops_api``, ``maskops_worker``) nor the Triton launcher;
- the core imports neither the API, the worker nor the engine, but the engine's
  standard-library-only modules that hold rules and file writing both sides share
  (``LIGHT_ENGINE_MODULES``);
- the API never imports the worker, the worker never imports the API;
- the worker's modules import each other without a cycle;
- every action of the catalogue has a worker function and a Celery task, and nothing else.

Imports are read from the source (every ``import``, also inside functions), so a lazy
import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "maskops": REPO / "services" / "worker" / "maskops",
    "maskops_worker": REPO / "services" / "worker" / "maskops_worker",
    "maskops_api": REPO / "services" / "api" / "maskops_api",
    "maskops_core": REPO / "services" / "core" / "maskops_core",
    "maskops_triton": REPO / "services" / "triton" / "maskops_triton",
}
FORBIDDEN = {
    "maskops": {"maskops_core", "maskops_api", "maskops_worker", "maskops_triton"},
    "maskops_core": {"maskops", "maskops_api", "maskops_worker", "maskops_triton"},
    "maskops_api": {"maskops_worker"},
    "maskops_worker": {"maskops_api"},
}
LIGHT_ENGINE_MODULES = {"maskops.atomic", "maskops.shape_rules"}
"""Engine modules that import the standard library alone: the one home of a rule or helper
that the control plane's core needs too (the core may import these, and nothing else of
the engine)."""
ALLOWED = {"maskops_core": LIGHT_ENGINE_MODULES}


def _forbidden(package: str, name: str) -> bool:
    allowed = ALLOWED.get(package, set())
    if any(name == module or name.startswith(module + ".") for module in allowed):
        return False
    return name.split(".")[0] in FORBIDDEN[package]


def _module_name(package: str, path: Path) -> str:
    parts = path.relative_to(PACKAGES[package]).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def _imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports, anywhere in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _sources(package: str) -> dict[str, Path]:
    return {_module_name(package, p): p for p in sorted(PACKAGES[package].rglob("*.py"))}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_rules(package: str) -> None:
    offences = [
        f"{module} imports {name}"
        for module, path in _sources(package).items()
        for name in sorted(_imports(path))
        if _forbidden(package, name)
    ]
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize("module", sorted(LIGHT_ENGINE_MODULES))
def test_light_engine_modules_import_the_standard_library_only(module: str) -> None:
    path = PACKAGES["maskops"] / (module.split(".", 1)[1].replace(".", "/") + ".py")
    outside = {
        name.split(".")[0]
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
    }
    assert not outside, f"{module} imports {sorted(outside)}"


def test_worker_modules_have_no_import_cycle() -> None:
    sources = _sources("maskops_worker")
    graph = {
        module: {name for name in _imports(path) if name in sources and name != module}
        for module, path in sources.items()
    }
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in visiting:
            cycle = [*visiting[visiting.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        visiting.append(module)
        for target in sorted(graph[module]):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_every_catalogue_action_has_a_function_and_a_task_and_nothing_else() -> None:
    from maskops_core.actions import TRAIN_NODE_TASK, JobAction
    from maskops_core.settings import get_settings
    from maskops_worker.actions import ACTIONS
    from maskops_worker.celery_app import app
    from maskops_worker.tasks import TASKS

    catalogue = {action.value for action in JobAction}
    assert all(action.name == action.value for action in JobAction)  # JobAction.named
    assert set(ACTIONS) == catalogue
    assert set(TASKS) == catalogue
    registered = {name for name in app.tasks if name.startswith("maskops.")}
    assert registered == {action.task_name for action in JobAction} | {TRAIN_NODE_TASK}
    routes, settings = app.conf.task_routes, get_settings()
    for action in JobAction:
        assert routes[action.task_name] == {"queue": action.queue(settings)}
        assert all(parent in catalogue for parent in action.spec.parents), action


def test_no_other_module_lists_the_actions() -> None:
    """A literal collection naming three or more actions is a second list of them."""
    from maskops_core.actions import JobAction

    names = {action.value for action in JobAction}
    catalogue = PACKAGES["maskops_core"] / "actions.py"
    offences = []
    for package in ("maskops_core", "maskops_api", "maskops_worker"):
        for module, path in _sources(package).items():
            if path == catalogue:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Set | ast.List | ast.Tuple | ast.Dict):
                    items = node.keys if isinstance(node, ast.Dict) else node.elts
                    listed = {
                        item.value
                        for item in items
                        if isinstance(item, ast.Constant) and item.value in names
                    }
                    # The worker's table of action functions is checked against the
                    # catalogue above.
                    if len(listed) >= 3 and module != "maskops_worker.actions":
                        offences.append(f"{module}:{node.lineno} lists {sorted(listed)}")
    assert not offences, "\n".join(offences)


def test_the_api_loads_no_model_library() -> None:
    """``import maskops_api.main`` (what uvicorn imports) loads no torch, onnx or worker."""
    code = (
        "import sys, maskops_api.main; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'torchvision', 'onnx', 'onnxruntime', 'PIL', 'maskops_worker'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    assert loaded == "[]"
