"""Search controllers never take the slots their trials need, and a stuck queue shows.

A controller holds a worker slot for its whole search. Where controllers and trials share
a worker's slots (``maskops serve``: one worker, two slots), two searches once took both
and waited forever on trials nothing could run, while ``/readyz`` said ok. Real Postgres
and Redis: searches beyond ``max_running_searches`` are not sent until one ends, a running
controller with that many older searches gives its slot back, and ``/readyz`` names a queue
whose sent jobs wait while no job runs but controllers.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from maskops_core import automl as searches
from maskops_core.db.models import Job, JobStatus, WorkerHeartbeat, utcnow
from maskops_core.db.session import make_engine, make_session_factory, transaction
from maskops_core.dispatch import CeleryDispatcher, dispatch_job
from maskops_core.settings import Settings

pytestmark = pytest.mark.integration


def _add_job(settings: Settings, **values: object) -> Job:
    engine = make_engine(settings)
    with transaction(make_session_factory(engine)) as session:
        job = Job(**values)
        session.add(job)
        session.flush()
    engine.dispose()
    return job


def test_a_search_beyond_the_limit_waits_unsent_until_one_ends(clean_db: Settings) -> None:
    settings = clean_db.model_copy(update={"max_running_searches": 1})
    engine = make_engine(settings)
    factory = make_session_factory(engine)
    dispatcher = CeleryDispatcher(settings)
    first = _add_job(settings, action="automl", queue=settings.cpu_queue)
    second = _add_job(settings, action="automl", queue=settings.cpu_queue)
    try:
        assert dispatch_job(factory, dispatcher, first)
        # The first one's message is out: it takes the one controller slot.
        assert not dispatch_job(factory, dispatcher, second)
        assert second.dispatch_count == 0 and second.dispatched_at is None
        # Both started anyway (sent before the limit): the younger one gives way.
        with transaction(factory) as session:
            session.execute(
                update(Job).where(Job.id.in_([first.id, second.id])).values(status="running")
            )
        assert searches.must_yield(factory, second.id, 1)
        assert not searches.must_yield(factory, first.id, 1)
        assert not searches.must_yield(factory, second.id, None)
        with transaction(factory) as session:
            session.execute(
                update(Job).where(Job.id == first.id).values(status=JobStatus.succeeded)
            )
            session.execute(update(Job).where(Job.id == second.id).values(status="queued"))
        assert dispatch_job(factory, dispatcher, second)  # the reconciler's next pass
        # A train job (a trial) is never held back.
        trial = _add_job(settings, action="train", queue=settings.gpu_queue)
        assert dispatch_job(factory, dispatcher, trial)
    finally:
        dispatcher.close()
        engine.dispose()


def test_readyz_names_a_queue_stalled_behind_search_controllers(
    client: TestClient, clean_db: Settings
) -> None:
    """Two controllers hold the only worker's slots; their trial, sent long ago, waits."""
    now = utcnow()
    for _ in range(2):
        _add_job(clean_db, action="automl", queue=clean_db.cpu_queue, status="running")
    trial = _add_job(
        clean_db,
        action="train",
        queue=clean_db.gpu_queue,
        dispatch_count=1,
        dispatched_at=now,
        updated_at=now - timedelta(seconds=clean_db.queue_stall_after_s + 5),
    )
    row = WorkerHeartbeat(
        hostname="embedded@host",
        queues=f"{clean_db.gpu_queue},{clean_db.cpu_queue}",
        pid=1,
        started_at=now,
        last_seen=now,
    )
    engine = make_engine(clean_db)
    with transaction(make_session_factory(engine)) as session:
        session.add(row)
    engine.dispose()
    response = client.get("/readyz")
    check = response.json()["checks"]["worker"]
    assert response.status_code == 503, response.text
    assert check.startswith(f"queue {clean_db.gpu_queue} is stalled: job {trial.id} has "), check
    assert "while no job runs but search controllers" in check
    # A worker busy with another job is not stalled, however long the queue waits.
    _add_job(clean_db, action="evaluate", queue=clean_db.cpu_queue, status="running")
    assert client.get("/readyz").json()["checks"]["worker"] == "ok"
