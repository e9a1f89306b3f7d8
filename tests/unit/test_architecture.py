"""The import rules between the packages, and the action catalogue as the one list of actions.

- the engine (``maskops``) imports none of the control plane (``maskops_core``,
  ``maskops_api``, ``maskops_worker``, ``maskops_serve``);
- the core imports neither the API, the worker nor the engine, but the engine's
  standard-library-only modules that hold rules and file writing both sides share
  (``LIGHT_ENGINE_MODULES``);
- the API never imports the worker, the worker never imports the API, and none of the
  packages imports the single-machine stack (``maskops_serve``), which may import them all;
- the Triton launcher (``maskops.serving.launcher``) imports the standard library, the
  engine's process-group helpers (``maskops.process_groups``, standard library alone) and,
  once it starts a server, the ``nvidia-pytriton`` wheel holding the binary; importing it
  loads only what the Triton image installs;
- no package's modules import each other in a cycle, and the engine's subpackages do not
  either (``maskops.export`` <-> ``maskops.serving`` would be one);
- every module of the API imports without a model library (torch, torchvision, onnx,
  onnxruntime, scipy), with the engine modules it imports, also inside functions;
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
    "maskops": REPO / "maskops",
    "maskops_worker": REPO / "services" / "worker" / "maskops_worker",
    "maskops_api": REPO / "services" / "api" / "maskops_api",
    "maskops_core": REPO / "services" / "core" / "maskops_core",
    "maskops_serve": REPO / "services" / "serve" / "maskops_serve",
}
FORBIDDEN = {
    "maskops": {"maskops_core", "maskops_api", "maskops_worker", "maskops_serve"},
    "maskops_core": {"maskops", "maskops_api", "maskops_worker", "maskops_serve"},
    "maskops_api": {"maskops_worker", "maskops_serve"},
    "maskops_worker": {"maskops_api", "maskops_serve"},
}
LIGHT_ENGINE_MODULES = {
    "maskops.atomic",
    "maskops.automl.options",
    "maskops.data.convert_options",
    "maskops.data.limits",
    "maskops.training.train_options",
    "maskops.evaluation.inference_options",
    "maskops.evaluation.options",
    "maskops.export.engine_options",
    "maskops.export.options",
    "maskops.options_schema",
    "maskops.tasks",
    "maskops.prune.options",
    "maskops.path_rules",
    "maskops.serving.protocol",
    "maskops.serving.publish_options",
    "maskops.shape_rules",
}
"""Engine modules that import the standard library alone: the one home of a rule or helper
that the control plane's core needs too (the core may import these, and nothing else of
the engine)."""
LAUNCHER = "maskops.serving.launcher"
LAUNCHER_ENGINE_MODULES = {"maskops.process_groups"}
"""The engine's process-group helpers (standard library only): the one part of the engine
the Triton launcher imports, shared with the embedded stack's supervisor."""
LAUNCHER_LIBRARIES = {"pytriton"}
"""The ``nvidia-pytriton`` wheel, whose server binary the launcher runs (imported when it
starts one)."""
ALLOWED = {"maskops_core": LIGHT_ENGINE_MODULES}
TRITON_IMAGE_LIBRARIES = {"numpy", "PIL", "pycocotools", "onnxruntime", "pydantic", "google"}
"""What the Triton image installs besides the standard library (the ``triton`` extra and
the project's base dependencies, pydantic and protobuf)."""
MODEL_LIBRARIES = ("torch", "torchvision", "onnx", "onnxruntime", "scipy")
"""Not in the API image; scipy fits the AutoML Gaussian process, on the workers only."""


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


def _imports(path: Path, module: str | None = None) -> set[str]:
    """Absolute module names ``path`` imports, anywhere in the file (relative imports too
    when ``module``, the file's own module name, is given)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module
            elif module is None:
                continue
            else:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1]]
                    + ([node.module] if node.module else [])
                )
            if base is None:
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _engine_path(module: str) -> Path:
    return PACKAGES["maskops"] / (module.split(".", 1)[1].replace(".", "/") + ".py")


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
    path = _engine_path(module)
    outside = {
        name.split(".")[0]
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        # One may build on another (the task declarations on maskops.options_schema).
        and not {name, name.rpartition(".")[0]} & LIGHT_ENGINE_MODULES
    }
    assert not outside, f"{module} imports {sorted(outside)}"


def test_light_engine_modules_load_nothing_but_the_standard_library() -> None:
    """Their packages' ``__init__`` run too: importing them loads no third-party module."""
    code = (
        "import sys, importlib; before = set(sys.modules); "
        f"[importlib.import_module(m) for m in {sorted(LIGHT_ENGINE_MODULES)!r}]; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
        "- set(sys.stdlib_module_names)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    assert loaded == "['maskops']"


def _all_sources() -> dict[str, Path]:
    return {module: path for package in PACKAGES for module, path in _sources(package).items()}


def _own_module(name: str, sources: dict[str, Path]) -> str | None:
    """The module of ours that an imported name lives in (``a.b.func`` -> ``a.b``)."""
    while name and name not in sources:
        name = name.rpartition(".")[0]
    return name or None


def _module_graph() -> dict[str, set[str]]:
    """Which of our modules each of our modules imports (anywhere in the file).

    A module's own packages are left out: Python runs their ``__init__`` before the module
    itself, so importing one of them from inside is never a cycle.
    """
    sources = _all_sources()
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets = {_own_module(name, sources) for name in _imports(path, module)}
        ancestors = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
        graph[module] = {t for t in targets if t is not None and t != module} - ancestors
    return graph


def _first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_modules_import_each_other_without_a_cycle(package: str) -> None:
    graph = {
        module: {t for t in targets if t.split(".")[0] == package}
        for module, targets in _module_graph().items()
        if module.split(".")[0] == package
    }
    cycle = _first_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _engine_unit(module: str) -> str:
    """The engine subpackage a module belongs to; the Triton models (copied into the model
    repository, importing nothing of maskops) are a unit of their own."""
    if module.startswith("maskops.serving.triton_models"):
        return "maskops.serving.triton_models"
    return ".".join(module.split(".")[:2])


def test_engine_subpackages_import_each_other_without_a_cycle() -> None:
    units: dict[str, set[str]] = {}
    for module, targets in _module_graph().items():
        if module.split(".")[0] != "maskops":
            continue
        unit = _engine_unit(module)
        units.setdefault(unit, set()).update(
            _engine_unit(t) for t in targets if t.split(".")[0] == "maskops"
        )
        units[unit].discard(unit)
    cycle = _first_cycle(units)
    assert cycle is None, "subpackage import cycle: " + " -> ".join(cycle or [])


TESTS_OF_PACKAGE = {
    "maskops_core": "tests/unit/core",
    "maskops_api": "tests/unit/api",
    "maskops_worker": "tests/unit/worker",
    "maskops_serve": "tests/unit/serve",
}
"""Where each package's tests live (the engine's: ``tests/unit/<subpackage>``)."""


def test_the_unit_tests_mirror_the_packages() -> None:
    assert set(TESTS_OF_PACKAGE) == set(PACKAGES) - {"maskops"}
    subpackages = {p.name for p in PACKAGES["maskops"].iterdir() if (p / "__init__.py").is_file()}
    folders = [*TESTS_OF_PACKAGE.values(), *(f"tests/unit/{name}" for name in subpackages)]
    missing = [f for f in folders if not any((REPO / f).glob("test_*.py"))]
    assert not missing, f"packages without a test folder of their own: {missing}"


@pytest.mark.parametrize("module", sorted({LAUNCHER, *LAUNCHER_ENGINE_MODULES}))
def test_the_triton_launcher_imports_the_standard_library_and_its_helpers_only(
    module: str,
) -> None:
    libraries = {*sys.stdlib_module_names, *(LAUNCHER_LIBRARIES if module == LAUNCHER else ())}
    offences = sorted(
        name
        for name in _imports(_engine_path(module))
        if name.split(".")[0] not in libraries
        and not any(name == m or name.startswith(m + ".") for m in LAUNCHER_ENGINE_MODULES)
    )
    assert not offences, f"{module} imports {offences}"


def test_the_triton_launcher_loads_only_what_the_triton_image_has() -> None:
    """Its packages' ``__init__`` run too (``maskops.serving`` imports its protocol)."""
    code = (
        f"import sys; before = set(sys.modules); import {LAUNCHER}; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
        "- set(sys.stdlib_module_names)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    outside = set(ast.literal_eval(loaded)) - TRITON_IMAGE_LIBRARIES
    assert outside == {"maskops"}, outside


BLOCKER = """
import importlib, importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is a model library (blocked by the test)")
        return None
sys.meta_path.insert(0, Blocker())
failed = {{}}
for module, imported in {targets!r}.items():
    for name in imported:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.setdefault(module, f"{{name}}: {{exc}}")
print(repr(failed))
"""


def test_every_api_module_imports_without_model_libraries() -> None:
    """Each API module, and each engine module it imports (also inside a function), imports
    with torch, torchvision, onnx, onnxruntime and scipy absent (the API image has none of them;
    what needs them, such as the demo walk's drawing, is the single-machine stack's)."""
    engine = _sources("maskops")
    targets = {}
    for module, path in _sources("maskops_api").items():
        used = {_own_module(name, engine) for name in _imports(path, module)}
        targets[module] = [module, *sorted(m for m in used if m is not None)]
    code = BLOCKER.format(blocked=set(MODEL_LIBRARIES), targets=targets)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    failed: dict[str, str] = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert failed == {}, failed


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
        "{'torch', 'torchvision', 'onnx', 'onnxruntime', 'scipy', 'PIL', 'maskops_worker'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    assert loaded == "[]"
