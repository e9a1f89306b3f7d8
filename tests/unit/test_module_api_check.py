"""bench/module_api_check.py finds a library name that the installed version lacks, and
the repository's sources name none (against the lock's versions here; bench/
rehearse_gpu_host runs it against the GPU image's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench import load_bench_module

module_api_check = load_bench_module("module_api_check")
REPO = Path(__file__).resolve().parents[2]


def test_a_missing_name_is_reported_with_its_place(tmp_path, capsys):
    (tmp_path / "uses.py").write_text(
        "import numpy as np\n"
        "import torch.distributed as dist\n"
        "from torch.cuda import amp\n"
        "from torch.cuda import no_such_function\n"
        "np.cross\n"
        "dist.no_such_timeout(1)\n"
        "amp.autocast\n"
        "torch_tensor = np.zeros(1).no_such_method  # an object's attribute: not checked\n"
    )
    assert module_api_check.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"missing torch.distributed.no_such_timeout: {tmp_path / 'uses.py'}:6" in out
    assert "missing torch.cuda.no_such_function" in out
    assert "2 missing name(s)" in out


@pytest.mark.parametrize("root", ["maskops", "bench"])
def test_the_sources_name_only_what_is_installed(root, capsys):
    assert module_api_check.main([str(REPO / root)]) == 0, capsys.readouterr().out
