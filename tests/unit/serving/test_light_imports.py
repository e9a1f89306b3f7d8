"""What the API image and the Triton image can import, checked in clean subprocesses.

The API image installs only the ``api`` extra (no torch, torchvision, onnx, onnxruntime,
Pillow, pycocotools) and calls :mod:`maskops.serving.client`; the Triton image installs
only the ``triton`` extra and runs the published ``model.py`` files, which may import
numpy, Pillow, pycocotools, onnxruntime and the ops file next to them, but neither torch
nor maskops. A ``sys.meta_path`` finder makes the forbidden imports fail as they would
there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from maskops.serving import EnsembleNames, publish
from tests.support.fake_export import fake_onnx_export

BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name in BLOCKED:
            raise ImportError(f"{{name}} is not installed in this image (blocked by the test)")
        return None
sys.meta_path.insert(0, Blocker())
"""

REPORT = """
import json
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {watched!r})))
"""

API_BLOCKED = ["torch", "torchvision", "onnx", "onnxruntime", "PIL", "pycocotools"]

# The real one exists only inside Triton's python stub: the tests write this stand-in.
TRITON_UTILS_STUB = '''"""Stand-in for Triton's python stub module (import only)."""
class Tensor: ...
class InferenceResponse: ...
class TritonError(Exception): ...
def get_input_tensor_by_name(request, name): ...
'''


def _run(code: str, *, cwd: Path, extra_path: Path | None = None) -> list[str]:
    """Run ``code`` in a fresh interpreter; return the JSON list it prints last."""
    env_path = [str(extra_path)] if extra_path else []
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_client_imports_without_torch_or_onnx(tmp_path: Path):
    code = (
        BLOCKER.format(blocked=API_BLOCKED)
        + "import maskops.serving.client\n"
        + "from maskops.serving import EnsembleNames, protocol\n"
        + "from maskops.serving.client import InvalidImage, ModelNotFound, TritonError\n"
        + "from maskops.serving.client import TritonUnavailable, infer_images, roll_out\n"
        + "from maskops.serving.replicas import ReplicaPool, roll_out_all\n"
        + REPORT.format(watched=[*API_BLOCKED, "maskops"])
    )
    loaded = _run(code, cwd=tmp_path)
    assert not [m for m in loaded if m.split(".")[0] in API_BLOCKED]
    assert set(loaded) == {
        "maskops",
        "maskops.serving",
        "maskops.serving.circuit",
        "maskops.serving.client",
        "maskops.serving.control",
        "maskops.serving.protocol",
        "maskops.serving.replicas",
    }


def test_publishing_names_still_import_from_the_package():
    # Lazily: the package itself does not import the repository (onnx, torch).
    from maskops.serving import (  # noqa: F401
        NET_BACKENDS,
        EnsembleNames,
        PublishError,
        existing_versions,
        publish,
        render_configs,
    )

    assert NET_BACKENDS == ("python", "onnxruntime", "tensorrt", "torch")


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A repository with one published model (python net backend)."""
    export = fake_onnx_export(tmp_path / "m.onnx", 1, data_type="fp32", max_batch_size=1)
    repo = tmp_path / "repo"
    publish(export, repo, "m")
    return repo


@pytest.mark.parametrize("part", ["preprocess", "net", "postprocess"])
def test_triton_models_import_without_torch_or_maskops(published: Path, tmp_path: Path, part):
    model_py = published / getattr(EnsembleNames("m"), part) / "1" / "model.py"
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "triton_python_backend_utils.py").write_text(TRITON_UTILS_STUB)
    blocked = ["torch", "torchvision", "onnx", "maskops", "maskops_api", "maskops_core"]
    code = (
        BLOCKER.format(blocked=blocked)
        + "import importlib.util\n"
        + f"spec = importlib.util.spec_from_file_location('model', {str(model_py)!r})\n"
        + "module = importlib.util.module_from_spec(spec)\n"
        + "spec.loader.exec_module(module)\n"
        + "assert hasattr(module.TritonPythonModel, 'execute')\n"
        + REPORT.format(watched=blocked)
    )
    # cwd is the temp dir: the checkout's sources must not be importable by accident.
    assert _run(code, cwd=tmp_path, extra_path=stubs) == []
