"""Job state transitions as a worker makes them: one claim per job, and after it every
write needs the lease, so a job taken over by another worker has one writer."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from maskops_core.db.models import Job, JobMetric, JobStatus
from maskops_core.job_state import claim, finish, heartbeat, report_progress, requeue
from tests.support.control_plane import get_job, insert_job


def test_a_queued_job_is_claimed_once(factory: sessionmaker[Session]) -> None:
    job_id = insert_job(factory)
    snapshot = claim(factory, job_id, owner="w1-lease", worker_id="w1")
    assert snapshot is not None and snapshot.id == job_id and snapshot.attempts == 1
    assert claim(factory, job_id, owner="w2-lease", worker_id="w2") is None
    job = get_job(factory, job_id)
    assert (job.status, job.lease_owner, job.worker_id) == (JobStatus.running, "w1-lease", "w1")


def test_writes_without_the_lease_are_refused(factory: sessionmaker[Session]) -> None:
    job_id = insert_job(factory)
    claim(factory, job_id, owner="mine", worker_id="w1")
    assert heartbeat(factory, job_id, owner="other").lease_lost
    assert not report_progress(factory, job_id, owner="other", step=1, total=10)
    assert not finish(factory, job_id, owner="other", status=JobStatus.succeeded)
    assert not requeue(factory, job_id, owner="other", reason="x")
    assert get_job(factory, job_id).status == JobStatus.running
    assert not heartbeat(factory, job_id, owner="mine").lease_lost


def test_progress_merges_metrics_and_keeps_each_point(factory: sessionmaker[Session]) -> None:
    job_id = insert_job(factory)
    claim(factory, job_id, owner="o", worker_id="w")
    assert report_progress(factory, job_id, owner="o", step=5, total=20, metrics={"loss": 2.0})
    assert report_progress(factory, job_id, owner="o", step=10, total=None, metrics={"AP": 0.1})
    job = get_job(factory, job_id)
    assert (job.progress_step, job.progress_total, job.progress_started_step) == (10, 20, 5)
    assert job.latest_metrics == {"loss": 2.0, "AP": 0.1}
    with factory() as session:
        points = session.query(JobMetric).filter_by(job_id=job_id).order_by(JobMetric.step)
        assert [(p.step, p.values) for p in points] == [(5, {"loss": 2.0}), (10, {"AP": 0.1})]


def test_a_requested_cancel_wins_over_success(factory: sessionmaker[Session]) -> None:
    job_id = insert_job(factory)
    claim(factory, job_id, owner="o", worker_id="w")
    with factory() as session, session.begin():
        session.get_one(Job, job_id).status = JobStatus.cancelling
    assert heartbeat(factory, job_id, owner="o").cancel_requested
    assert finish(factory, job_id, owner="o", status=JobStatus.succeeded, result={"a": 1})
    job = get_job(factory, job_id)
    assert job.status == JobStatus.cancelled and job.lease_owner is None


def test_a_requeued_job_is_claimed_again_with_the_next_attempt(
    factory: sessionmaker[Session],
) -> None:
    job_id = insert_job(factory)
    claim(factory, job_id, owner="first", worker_id="w1")
    assert requeue(factory, job_id, owner="first", reason="worker is shutting down")
    job = get_job(factory, job_id)
    assert (job.status, job.error, job.lease_owner) == (
        JobStatus.queued,
        "worker is shutting down",
        None,
    )
    again = claim(factory, job_id, owner="second", worker_id="w2")
    assert again is not None and again.attempts == 2
    assert get_job(factory, job_id).error is None
    # The first worker's late report cannot touch the second attempt.
    assert not finish(factory, job_id, owner="first", status=JobStatus.failed, error="late")
