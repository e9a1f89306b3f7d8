"""The tritonserver of the nvidia-pytriton wheel runs as services/install-extra installs
it for the ``serve`` extra: without the dependencies the wheel declares (numpy<2 among
them), which only pytriton's own Python API imports, and maskops never imports that."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.support.extras import BLOCKED_ENV, GUARD_DIR, distributions_of
from tests.support.triton_toy import toy_model

pytestmark = pytest.mark.integration
pytest.importorskip("pytriton")

SERVE_AND_ECHO = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import numpy as np
    import tritonclient.http as http

    from maskops.serving.launcher import TritonServer

    try:
        import pytriton  # noqa: F401
        sys.exit("pytriton imports: its dependencies are not hidden")
    except ImportError:
        pass
    with TritonServer(Path(sys.argv[1]), models=["echo"]) as server:
        client = http.InferenceServerClient(server.http_url)
        sent = http.InferInput("IN", [1], "FP32")
        sent.set_data_from_numpy(np.array([2.5], dtype=np.float32))
        print(np.__version__, client.infer("echo", [sent]).as_numpy("OUTPUT").tolist())
        client.close()
    """
)


def _declared_by_the_wheel_alone() -> set[str]:
    """Top-level modules of what nvidia-pytriton declares that the serve extra lacks."""
    wheel = distributions_of(set(), project="nvidia-pytriton") - {"nvidia-pytriton"}
    alone = wheel - distributions_of({"serve"})
    return {
        module
        for module, dists in metadata.packages_distributions().items()
        if any(canonicalize_name(d) in alone for d in dists)
    }


def test_the_server_runs_without_the_wheels_declared_dependencies(tmp_path: Path) -> None:
    hidden = _declared_by_the_wheel_alone()
    assert {"zmq", "sh"} <= hidden  # pytriton's own, which its __init__ imports
    toy_model(tmp_path, "echo")
    env = {
        **os.environ,
        BLOCKED_ENV: ",".join(sorted(hidden)),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(GUARD_DIR), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", SERVE_AND_ECHO, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    numpy_version, echoed = result.stdout.split(maxsplit=1)
    assert int(numpy_version.split(".")[0]) >= 2 and echoed.strip() == "[2.5]"
