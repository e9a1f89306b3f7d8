"""A job's log never shows where the server keeps its data: the worker's own lines, the
engine's training log (a resumed run names its checkpoint) and a child process's output
(torchrun's command, the ranks' lines) are all written with paths relative to the data
root, as job errors are."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from maskops.spec.models import ExperimentSpec
from maskops.training.train import logger as training_logger
from maskops.training.train import run_training
from maskops_worker.job_log import JobLog


def _job_log(data_root: Path, job_id: int = 5) -> JobLog:
    folder = data_root / "jobs" / str(job_id)
    folder.mkdir(parents=True)
    return JobLog(folder / "job.log", data_root)


def test_the_worker_lines_name_paths_relative_to_the_data_root(tmp_path: Path) -> None:
    log = _job_log(tmp_path)
    log.write(f"reading {tmp_path}/datasets/a/train.json\n")
    log.write(f"the data root is {tmp_path}")
    assert log.path.read_text() == ("reading datasets/a/train.json\nthe data root is .\n")


def test_a_resumed_training_logs_its_checkpoint_relative(
    tmp_path: Path, tiny_checkpoint: Path, tiny_spec: ExperimentSpec
) -> None:
    log = _job_log(tmp_path)
    results = log.path.parent / "results"
    shutil.copytree(tiny_checkpoint.parent, results)
    longer = tiny_spec.model_copy(update={"total_steps": tiny_spec.total_steps + 1})
    with log.engine_lines(training_logger):
        result = run_training(longer, results)
    assert result.checkpoint is not None
    written = log.path.read_text()
    assert f"resuming from jobs/5/results/{tiny_checkpoint.name}" in written, written
    assert str(tmp_path) not in written
    # Detached afterwards: the engine's later lines go elsewhere.
    training_logger.info("after the job: %s", tmp_path)
    assert log.path.read_text() == written


def test_a_child_process_output_is_relayed_relative(tmp_path: Path) -> None:
    log = _job_log(tmp_path)
    script = (
        "import sys; "
        f"print('rank 0 saved {tmp_path}/jobs/5/results/model.step-2.pth'); "
        f"sys.stderr.write('torchrun: {tmp_path}/jobs/5/launch failed')"
    )
    with log.process_output() as output:
        subprocess.run([sys.executable, "-c", script], stdout=output, stderr=subprocess.STDOUT)
    assert log.path.read_text() == (
        "rank 0 saved jobs/5/results/model.step-2.pth\ntorchrun: jobs/5/launch failed\n"
    )
