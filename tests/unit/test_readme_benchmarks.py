"""README.md's benchmark table is what bench/readme_table.py generates from bench/results/.

Reads JSON only: the figures come from benchmark runs on an idle machine, not from CI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.bench import load_bench_module

REPO = Path(__file__).resolve().parents[2]


readme_table = load_bench_module("readme_table")


def test_readme_table_is_generated_from_the_results() -> None:
    current = readme_table.readme_section((REPO / "README.md").read_text())
    assert current == readme_table.table(), "run: python bench/readme_table.py"


def test_every_row_names_its_machine_and_command() -> None:
    rows = [
        line
        for line in readme_table.table().splitlines()
        if line.startswith("| ") and not line.startswith("| what")
    ]
    assert rows
    for line in rows:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert len(cells) == 4 and all(cells), line


def test_a_loaded_run_is_held_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    shutil.copytree(REPO / "bench" / "results", results)
    path = results / "bench_api.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "loaded": True}))
    monkeypatch.setattr(readme_table, "RESULTS", results)
    table = readme_table.table()
    assert "Idempotency-Key |" not in table
    assert "awaiting an idle rerun" in table and "1,000 job submissions" in table


def test_a_legacy_file_with_its_load_above_the_cores_counts_as_loaded() -> None:
    assert readme_table.is_loaded({"load_average_1min": 13.7, "cpu_count": 2})
    assert not readme_table.is_loaded({"load_average_1min": 0.5, "cpu_count": 2})
    assert not readme_table.is_loaded({"loaded": False})


def test_every_results_file_records_its_machine_and_load_or_says_why_not() -> None:
    """A figure names the machine and the load it was measured under; the
    files of runs older than that record say so instead of leaving the reader to guess."""
    results = sorted((REPO / "bench" / "results").glob("*.json"))
    # maskops prune's own reports sit beside the bench's results of the same run.
    results = [path for path in results if not path.name.endswith(".prune_report.json")]
    assert len(results) > 10
    recorded = set(load_bench_module("machine").describe_machine())
    for path in results:
        doc = json.loads(path.read_text())
        if doc.get("machine") is None:
            assert doc.get("machine_not_recorded"), f"{path.name}: no machine, and no reason"
            continue
        assert recorded <= doc["machine"].keys(), path.name
        assert "load_average" in doc or doc.get("load_not_recorded"), path.name


def _gpu_check_doc(**changes: object) -> dict[str, object]:
    """A gpu_check.json as a GPU run writes it (figures as wide as real ones get)."""
    machine = load_bench_module("machine").describe_machine()
    steps = {
        name: {"status": "passed", "seconds": 1.0, "figures": {}}
        for name in ("environment", "pytest_gpu", "train_amp", "eval_parity", "export_onnx")
    }
    steps["tensorrt"] = {"status": "skipped", "seconds": 0.0, "note": "no TensorRT"}
    steps["throughput_train"] = {
        "status": "passed",
        "figures": {
            "amp": {"dtype": "torch.bfloat16", "scaler": False},
            "maskops_vs_torchvision": {"amp": {"ratio": 1.123}},
        },
    }
    steps["throughput_inference"] = {
        "status": "passed",
        "figures": {
            "images_per_s": {
                "batch_1_fp32": {"median_images_per_s": 123.45},
                "batch_8_fp32": {"median_images_per_s": 456.78},
            }
        },
    }
    doc: dict[str, object] = {
        "check": "gpu_check",
        "device": "cuda",
        "tiny": False,
        "gpu": "NVIDIA H100 80GB HBM3 (sm_90)",
        "steps": steps,
        "machine": {**machine, "gpu": "NVIDIA H100 80GB HBM3"},
        "loaded": False,
        "command": "python bench/gpu_check.py --wheels .gpu-wheels",
    }
    return {**doc, **changes}


def test_a_gpu_check_row_only_from_a_gpu_run_and_the_readme_stays_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    shutil.copytree(REPO / "bench" / "results", results)
    monkeypatch.setattr(readme_table, "RESULTS", results)
    gpu_file = results / readme_table.GPU_CHECK
    gpu_file.unlink(missing_ok=True)
    assert readme_table.NO_GPU_YET in readme_table.table()  # no file yet
    cpu_runs = [
        _gpu_check_doc(device="cpu", gpu=None),
        _gpu_check_doc(tiny=True),
        _gpu_check_doc(machine={"gpu": None}),
    ]
    for doc in cpu_runs:
        gpu_file.write_text(json.dumps(doc))
        table = readme_table.table()
        assert readme_table.NO_GPU_YET in table and "one GPU" not in table
    gpu_file.write_text(json.dumps(_gpu_check_doc()))
    table = readme_table.table()
    (row,) = (line for line in table.splitlines() if line.startswith("| one GPU"))
    assert "| NVIDIA H100 80GB HBM3 (sm_90) |" in row
    assert "7/7 steps passed (tensorrt skipped)" in row
    assert "bf16 R50 training **1.123x**" in row and "123.5 / 456.8 img/s" in row
    assert readme_table.NO_GPU_YET not in table
    readme = (REPO / "README.md").read_text()
    with_gpu = readme.replace(readme_table.readme_section(readme), table)
    assert len(with_gpu.encode()) < 15_000, "shorten the README before a GPU row can land"
