"""The worker's runner on a real (SQLite) database: claim, progress and metrics, result,
failure, cancel, requeue, and what a job's error and log may show."""

from __future__ import annotations

import json
import sysconfig
import threading
import time
from typing import Any

from sqlalchemy import select, update

from maskops_core.db.models import Job, JobMetric
from maskops_core.settings import Settings
from maskops_worker.contract import JobContext, JobRequeued
from maskops_worker.runner import run_job
from tests.support.control_plane import get_job as _get
from tests.support.control_plane import insert_job as _job


def test_success_records_progress_metrics_and_result(settings: Settings, factory) -> None:
    job_id = _job(factory)

    def action(ctx: JobContext) -> dict[str, Any]:
        for step in range(1, 4):
            ctx.report(step, 3, {"Total loss": 1.0 / step})
        return {"checkpoint": "x.pth"}

    assert run_job(job_id, settings=settings, actions={"train": action}) == "succeeded"
    job = _get(factory, job_id)
    assert (job.status, job.attempts, job.progress_step, job.progress_total) == (
        "succeeded",
        1,
        3,
        3,
    )
    assert job.result == {"checkpoint": "x.pth"} and job.lease_owner is None
    assert job.latest_metrics == {"Total loss": 1.0 / 3}
    with factory() as s:
        steps = s.scalars(select(JobMetric.step).where(JobMetric.job_id == job_id)).all()
    assert steps == [1, 2, 3]
    log = (settings.jobs_dir / str(job_id) / "job.log").read_text()
    assert "attempt 1: train started" in log and "attempt 1: succeeded" in log


def test_failure_is_one_line_with_traceback_in_the_log(settings: Settings, factory) -> None:
    job_id = _job(factory)

    def action(ctx: JobContext) -> dict[str, Any]:
        raise ValueError("image 7: annotation 3 has\na negative width")

    assert run_job(job_id, settings=settings, actions={"train": action}) == "failed"
    job = _get(factory, job_id)
    assert job.error == "ValueError: image 7: annotation 3 has a negative width"
    assert "Traceback" in (settings.jobs_dir / str(job_id) / "job.log").read_text()


def test_a_tracebacks_frames_name_paths_from_their_package_on(settings: Settings, factory) -> None:
    """Clients read the log: a frame of site-packages, the standard library or the
    worker's own code shows no install path."""
    job_id = _job(factory)

    def action(ctx: JobContext) -> dict[str, Any]:
        from sqlalchemy import make_url

        try:
            json.loads("{")
        except ValueError:
            make_url("::not a url")
        return {}

    assert run_job(job_id, settings=settings, actions={"train": action}) == "failed"
    log = (settings.jobs_dir / str(job_id) / "job.log").read_text()
    for frame in ("sqlalchemy/engine/url.py", "json/decoder.py", "maskops_worker/runner.py"):
        assert f'File "{frame}", line ' in log, log
    assert "site-packages" not in log and sysconfig.get_paths()["stdlib"] not in log, log


def test_a_job_that_cannot_start_yet_goes_back_to_the_queue_with_the_reason(
    settings: Settings, factory
) -> None:
    """(The nodes of a multi-node job that did not gather.) Queued again for the
    reconciler to send, the reason as its error until the next claim clears it."""
    job_id = _job(factory)

    def action(ctx: JobContext) -> dict[str, Any]:
        raise JobRequeued("the 2 hosts did not gather within 10 s")

    assert run_job(job_id, settings=settings, actions={"train": action}) == "queued"
    job = _get(factory, job_id)
    assert (job.status, job.error, job.lease_owner, job.dispatched_at) == (
        "queued",
        "the 2 hosts did not gather within 10 s",
        None,
        None,
    )
    assert run_job(job_id, settings=settings, actions={"train": lambda c: {}}) == "succeeded"
    assert _get(factory, job_id).error is None


def test_only_queued_jobs_are_claimed(settings: Settings, factory) -> None:
    calls: list[int] = []

    def action(ctx: JobContext) -> dict[str, Any]:
        calls.append(ctx.job.id)
        return {}

    for status in ("running", "succeeded", "cancelled"):
        job_id = _job(factory, status=status)
        result = run_job(job_id, settings=settings, actions={"train": action})
        assert result == "skipped"
    assert calls == []


def test_cancel_stops_at_the_next_step(settings: Settings, factory) -> None:
    job_id = _job(factory)
    reached = threading.Event()

    def action(ctx: JobContext) -> dict[str, Any]:
        for step in range(1, 1000):
            if ctx.cancel_requested:
                return {"stopped_at": step}
            ctx.report(step, 1000)
            reached.set()
            time.sleep(0.01)
        return {}

    worker = threading.Thread(
        target=run_job, args=(job_id,), kwargs={"settings": settings, "actions": {"train": action}}
    )
    worker.start()
    assert reached.wait(10)
    with factory() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(status="cancelling"))
    worker.join(20)
    job = _get(factory, job_id)
    assert job.status == "cancelled" and job.result is not None
    assert job.result["stopped_at"] < 1000


def test_an_input_missing_from_the_data_root_fails_naming_it(settings: Settings, factory) -> None:
    """A parent's checkpoint written on a host that does not share the data root."""
    from maskops_worker.actions import ACTIONS

    parent = _job(
        factory, status="succeeded", result={"checkpoint": "jobs/99/results/model.step-4.pth"}
    )
    job_id = _job(factory, parent_job_id=parent)
    with factory() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(action="prune", options={}))

    assert run_job(job_id, settings=settings, actions=ACTIONS) == "failed"
    error = _get(factory, job_id).error or ""
    assert "'jobs/99/results/model.step-4.pth' is not in the data root" in error
    assert "MASKOPS_DATA_ROOT" in error and "Traceback" not in error
    assert str(settings.data_root) not in error  # no absolute server path


def test_errors_and_logs_name_paths_relative_to_the_data_root(settings: Settings, factory) -> None:
    job_id = _job(factory)
    inside = settings.data_root.resolve() / "jobs" / str(job_id) / "results" / "model.pth"

    def action(ctx: JobContext) -> dict[str, Any]:
        raise FileNotFoundError(2, "No such file or directory", str(inside))

    assert run_job(job_id, settings=settings, actions={"train": action}) == "failed"
    error = _get(factory, job_id).error or ""
    assert error == (
        f"FileNotFoundError: [Errno 2] No such file or directory: 'jobs/{job_id}/results/model.pth'"
    )
    log = (settings.jobs_dir / str(job_id) / "job.log").read_text()
    assert "Traceback" in log and f"'jobs/{job_id}/results/model.pth'" in log
    for root in {str(settings.data_root.absolute()), str(settings.data_root.resolve())}:
        assert root not in log and root not in error


def test_an_input_through_a_link_out_of_the_data_root_is_refused(
    settings: Settings, factory, tmp_path_factory
) -> None:
    """A link inside the data root pointing out of it: the worker reads nothing there."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "model.pth").write_bytes(b"not the data root's")
    (settings.data_root / "shared").symlink_to(outside, target_is_directory=True)
    job_id = _job(factory)

    def action(ctx: JobContext) -> dict[str, Any]:
        return {"read": ctx.input_path("shared/model.pth", "model_path").read_text()}

    assert run_job(job_id, settings=settings, actions={"train": action}) == "failed"
    error = _get(factory, job_id).error or ""
    assert "model_path 'shared/model.pth'" in error and "links out of it" in error
    assert str(outside) not in error
