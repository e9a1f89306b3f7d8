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


def test_a_cancel_request_follows_one_rule_from_the_api_and_from_a_search(
    factory: sessionmaker[Session],
) -> None:
    """Queued: cancelled at once; running: cancelling; cancelling: as it is."""
    from maskops_api.services.jobs import cancel_job
    from maskops_core.automl import cancel_trials

    search = insert_job(factory)
    statuses = (JobStatus.queued, JobStatus.running, JobStatus.cancelling)
    trials = [insert_job(factory, parent_job_id=search, status=s) for s in statuses]
    alone = [insert_job(factory, status=s) for s in statuses]
    assert sorted(cancel_trials(factory, search)) == trials
    with factory() as session:
        for job_id in alone:
            cancel_job(session, job_id)
    want = [JobStatus.cancelled, JobStatus.cancelling, JobStatus.cancelling]
    for ids in (trials, alone):
        jobs = [get_job(factory, job_id) for job_id in ids]
        assert [j.status for j in jobs] == want
        assert jobs[0].finished_at is not None and jobs[1].finished_at is None
