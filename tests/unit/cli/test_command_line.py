"""The command line's conventions: ``--version``, one-line errors (tracebacks under
``--verbose``), shell completion that bash really runs, and progress: a bar with rate and
ETA in a real terminal (tmux), whole lines in a pipe."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from maskops.cli.completion import completion_script
from maskops.cli.main import build_parser, main, maskops_version
from maskops.progress import PhaseProgress, PlainProgress, format_duration, stage

if TYPE_CHECKING:
    from maskops.data.demo import DemoDataset
    from maskops.spec.models import ExperimentSpec

MASKOPS = [sys.executable, "-m", "maskops.cli.main"]
TQDM_BAR = re.compile(r"\d+/\d+ \[\d+:\d+<\d+:\d+, +[\d.?]+ ?(\w+/s|s/\w+)")
"""tqdm's bar: ``3/4 [00:02<00:00,  1.50step/s]``: count, elapsed<ETA, rate."""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"maskops {maskops_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", maskops_version())


def _subcommands() -> list[str]:
    action = next(a for a in build_parser()._actions if a.dest == "command")
    assert action.choices is not None
    return sorted(action.choices)


@pytest.mark.parametrize("command", _subcommands())
def test_every_command_prints_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A declared option's help is plain text ("2% of ..."): argparse must not read its `%`
    # as a format directive (`maskops inference --help` once failed with a TypeError).
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: maskops {command}")


def _spec_file(tmp_path: Path, spec: ExperimentSpec, **updates: object) -> Path:
    from maskops.spec import spec_to_text

    path = tmp_path / "spec.txt"
    path.write_text(spec_to_text(spec.model_copy(update=updates)))
    return path


@pytest.mark.usefixtures("signal_handlers")
def test_unexpected_error_is_one_line_and_verbose_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A results folder that cannot be made is no CLIError: still one line, no traceback."""
    from maskops.spec.models import ExperimentSpec

    spec = _spec_file(tmp_path, ExperimentSpec())
    command = ["train", "-e", str(spec), "-d", "/proc/maskops-no-such-dir"]
    assert main(command) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("maskops train: error: FileNotFoundError: ")
    assert "--verbose shows the traceback" in lines[0]
    for verbose in ([*command, "--verbose"], ["--verbose", *command]):
        assert main(verbose) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err.strip().splitlines()[-1].startswith("maskops train: error: ")


def test_error_message_of_several_lines_prints_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.txt"
    spec.write_text("total_steps: 1\nnot a field at all\n")
    assert main(["spec", "check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("maskops spec: error: "), err


def test_serve_refuses_a_walk_without_training_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--demo", "--demo-steps", "0", "--state-dir", str(tmp_path / "state")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "maskops serve: error: --demo-steps must be at least 1, got 0"
    )
    assert not (tmp_path / "state").exists()  # refused before anything started


def _complete(script: str, line: str) -> list[str]:
    """What bash's completion of ``line`` (cursor at its end) offers, by running the script's
    function the way ``complete -F`` does."""
    words = line.split(" ")
    program = "\n".join(
        [
            script,
            "COMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")",
            f"COMP_CWORD={len(words) - 1}",
            "_maskops",
            'printf "%s\\n" "${COMPREPLY[@]}"',
        ]
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completion_from_the_parser(tmp_path: Path) -> None:
    script = completion_script(build_parser(), "bash")
    assert {"train", "evaluate", "export", "completion"} <= set(_complete(script, "maskops "))
    assert _complete(script, "maskops tr") == ["train"]
    assert "--experiment_spec" in _complete(script, "maskops train --exp")
    assert _complete(script, "maskops spec ch") == ["check"]
    assert _complete(script, "maskops spec check --te") == ["--text"]
    assert _complete(script, "maskops dataset_convert --format la") == ["labelme", "labelstudio"]
    assert _complete(script, "maskops completion ") == ["bash", "zsh"]
    (tmp_path / "run.txt").write_text("")
    assert _complete(script, f"maskops train -e {tmp_path}/ru") == [f"{tmp_path}/run.txt"]
    zsh = completion_script(build_parser(), "zsh")
    assert zsh.splitlines()[1] == "autoload -U +X bashcompinit && bashcompinit"


def test_completion_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == completion_script(build_parser(), "bash")


def test_plain_progress_lines() -> None:
    """Off a terminal: whole lines with count, percent, rate and ETA, at most one per
    interval, and always one at the end."""
    import io

    now = [0.0]
    out = io.StringIO()
    with PlainProgress(8, desc="evaluate", unit="img", stream=out, clock=lambda: now[0]) as bar:
        for _ in range(4):
            now[0] += 1.0
            bar.update(2)
    lines = out.getvalue().splitlines()
    assert lines == [
        "evaluate: 2/8 img (25%), 2.00 img/s, ETA 3s",
        "evaluate: 8/8 img (100%), 2.00 img/s, 4s elapsed",
    ]
    assert "\r" not in out.getvalue()
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05"


def test_stages_and_builder_phases_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """A stage's line goes to the log; its progress, and a builder's top-level phases (as
    TensorRT reports them), are whole lines on stderr, each count written once."""
    log: list[str] = []
    with stage(log.append, "Checking 4 images", total=4, desc="parity", unit="img") as bar:
        bar.update(4)
    with stage(log.append, "Writing model.onnx") as nothing:
        nothing.update(1)
    phases = PhaseProgress(desc="engine")
    phases.phase_start("Building engine", None, 2)
    phases.phase_start("Tactics", "Building engine", 50)
    assert all(phases.step_complete("Tactics", step) for step in range(50))
    phases.phase_finish("Tactics")
    assert phases.step_complete("Building engine", 0) and phases.step_complete("Building engine", 1)
    phases.phase_finish("Building engine")
    phases.close()
    assert log == ["Checking 4 images", "Writing model.onnx"]
    lines = [
        re.sub(r", [\d.]+ (img|step)/s.*", "", line)
        for line in capsys.readouterr().err.splitlines()
    ]
    assert lines == [
        "parity: 4/4 img (100%)",
        "engine: Building engine: 1/2 step (50%)",
        "engine: Building engine: 2/2 step (100%)",
    ]


def test_dataset_convert_off_a_terminal_writes_progress_lines(
    tmp_path: Path, demo_dataset: DemoDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    images, annotations = demo_dataset.val_images, demo_dataset.val_json
    argv = ["dataset_convert", "-i", str(images), "-a", str(annotations), "-o", str(tmp_path)]
    assert main([*argv, "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^convert: 8/8 img \(100%\), [\d.]+ img/s", err, re.M), err


def test_evaluate_off_a_terminal_writes_progress_lines(
    tmp_path: Path, tiny_spec: ExperimentSpec, tiny_checkpoint: Path
) -> None:
    spec = _spec_file(tmp_path, tiny_spec)
    done = subprocess.run(
        [*MASKOPS, "evaluate", "-e", str(spec), "-m", str(tiny_checkpoint), "-r", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    assert re.search(r"^evaluate: 4/4 img \(100%\), [\d.]+ img/s", done.stderr, re.M), done.stderr


def _first_line(lines: list[str], prefix: str, pane: str) -> int:
    numbers = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    assert numbers, f"no line starts with {prefix!r}:\n{pane}"
    return numbers[0]


def _pane_after(session: str, command: str, until: str, timeout_s: float) -> str:
    """Run ``command`` in a detached tmux terminal (120x40) and return its screen once
    ``until`` shows (or at the timeout)."""
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", command],
        check=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        pane = ""
        while time.monotonic() < deadline:
            pane = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            if until in pane:
                break
            time.sleep(0.5)
        return pane
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (./dev installs it)")
def test_train_shows_a_progress_bar_in_a_terminal(
    tmp_path: Path, tiny_spec: ExperimentSpec
) -> None:
    spec = _spec_file(tmp_path, tiny_spec, total_steps=2)
    command = " ".join([*MASKOPS, "train", "-e", str(spec), "-d", str(tmp_path / "run")])
    pane = _pane_after(
        f"maskops-test-{time.monotonic_ns()}",
        f"{command}; echo exit=$?; sleep 60",
        "exit=",
        timeout_s=240,
    )
    assert "exit=0" in pane, pane
    bars = [line for line in pane.splitlines() if TQDM_BAR.search(line)]
    assert bars, pane
    # One whole line each time it shows: log lines are written above it, never into it.
    assert all(re.fullmatch(r" *\d+%\|.*\] *", line) for line in bars), pane
    assert re.search(r"\b2/2 \[", bars[-1]), pane
    assert "training finished at step 2/2" in pane


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (./dev installs it)")
def test_export_shows_a_bar_per_counted_stage_in_a_terminal(
    tmp_path: Path, tiny_spec: ExperimentSpec, tiny_checkpoint: Path
) -> None:
    """int8, for the most stages: a line as each starts, a bar for calibration, parity and
    the two evaluations, and onnxruntime's warnings written above a bar, not into it."""
    spec = _spec_file(tmp_path, tiny_spec)
    out = tmp_path / "m8.onnx"
    argv = ["export", "-m", str(tiny_checkpoint), "-e", str(spec), "-o", str(out)]
    int8 = ["--data_type", "int8", "--batches", "1", "--batch_size", "2"]
    pane = _pane_after(
        f"maskops-test-{time.monotonic_ns()}",
        " ".join([*MASKOPS, *argv, *int8]) + "; echo exit=$?; sleep 60",
        "exit=",
        timeout_s=240,
    )
    assert "exit=0" in pane, pane
    lines = pane.splitlines()
    found = [(m.group(1), line) for line in lines if (m := re.match(r"([\w ]+): +\d+%\|", line))]
    bars = dict(found)
    # One line each: a warning written during calibration went above the bar.
    assert len(found) == len(bars), pane
    assert set(bars) == {"calibrate", "parity", "evaluate fp32", "evaluate int8"}, pane
    for name, line in bars.items():
        assert TQDM_BAR.search(line) and re.fullmatch(r"[\w ]+: +100%\|.*\] *", line), pane
        assert re.search(r"\b(2/2|4/4) \[", line), (name, pane)
    stages = ["Tracing ", "Calibrating int8 on 2 images", "Checking the ONNX against PyTorch"]
    stages += ["Writing ", "Exported "]
    starts = [_first_line(lines, stage, pane) for stage in stages]
    assert starts == sorted(starts), pane
    assert starts[1] < lines.index(bars["calibrate"]) < starts[2] < lines.index(bars["parity"])
