"""``maskops spec check`` / ``maskops spec defaults`` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from maskops.cli.main import main
from maskops.spec import ExperimentSpec, load_spec, parse_spec_text

from .conftest import FIXTURES

MASKOPS = Path(sys.executable).with_name("maskops")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MASKOPS), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_check_command_accepts_a_tao_sample_and_rejects_a_broken_spec(tmp_path: Path) -> None:
    sample = FIXTURES / "tao_tutorials_maskrcnn_train_resnet50.txt"
    ok = _run("spec", "check", str(sample))
    assert ok.returncode == 0, ok.stderr
    assert ExperimentSpec.model_validate(json.loads(ok.stdout)) == load_spec(sample)

    broken = tmp_path / "spec.txt"
    broken.write_text(sample.read_text().replace("nlayers: 50", "nlayers: 42"))
    line = 1 + sample.read_text().splitlines().index("    nlayers: 50")
    bad = _run("spec", "check", str(broken))
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        f"maskops spec: error: {broken}:{line}: maskrcnn_config.nlayers: "
        "42 is not one of 10, 18, 34, 50, 101"
    ]


def test_check_json_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"maskrcnn_config": {"nlayers": 18}, "num_epochs": 2}))
    assert main(["spec", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"maskops spec: error: {path}: num_examples_per_epoch: required (> 0) when num_epochs "
        "is set (2): total_steps = num_epochs * num_examples_per_epoch / train_batch_size"
    )

    path.write_text(
        json.dumps({"num_epochs": 2, "num_examples_per_epoch": 10, "train_batch_size": 4})
    )
    assert main(["spec", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["num_epochs"] == 2
    assert "total_steps 5" in err


def test_check_text_output_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    sample = FIXTURES / "tao_tf1_backend_default.txt"
    assert main(["spec", "check", "--text", str(sample)]) == 0
    assert parse_spec_text(capsys.readouterr().out) == load_spec(sample)


def test_check_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["spec", "check", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt: no such file" in capsys.readouterr().err


def test_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "defaults"]) == 0
    assert parse_spec_text(capsys.readouterr().out) == ExperimentSpec()


def test_check_resolve_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.txt"
    path.write_text('data_config {\n  training_file_pattern: "shards/train*"\n}\n')
    assert main(["spec", "check", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["data_config"]["training_file_pattern"] == (
        "shards/train*"
    )
    assert main(["spec", "check", "--resolve-paths", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["data_config"]["training_file_pattern"] == str(
        tmp_path / "shards" / "train*"
    )
