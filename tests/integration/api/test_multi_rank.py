"""A train job on two ranks over REST: torchrun under a real Celery worker (gloo on the CPU),
cancelled (both ranks stop, the checkpoint is kept), resumed, a rank SIGKILLed (torchrun
restarts the group, which forms again and resumes), and ending with the weights of the
CLI's uninterrupted ``--gpus 2`` run of the same spec; a job asking for more ranks than any
worker offers is refused at the door; a job over two workers' nodes (one missing first),
and one whose second node dies mid-run."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from maskops.checkpoints.model_file import load_model
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from maskops_core.workers import rank_offers
from tests.integration.api.conftest import Worker, wait_for
from tests.integration.api.test_reliability import _reconcile
from tests.integration.api.test_workflow import create_experiment, register_demo
from tests.support.ranks import rank_pids, run_ranks, wait_until

pytestmark = pytest.mark.integration


def test_two_rank_job_cancels_resumes_survives_a_killed_rank_and_ends_as_the_cli_run(
    client: TestClient,
    clean_db: Settings,
    workers: Callable[..., Worker],
    demo_root: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Cancelled (both ranks stop, the checkpoint is kept), resumed, and a rank of the
    resumed group SIGKILLed: torchrun restarts the group, which forms again (it once hung
    on the dead group's addresses) and resumes. No step is trained twice into the weights:
    they equal an uninterrupted CLI run's."""
    # Heartbeats, which carry the cancel to the job, five times as often as the other
    # tests': with 0.5 s ones an idle 2-core Zen 5 EPYC trained 7 of 8 steps, or all 8,
    # before the cancel landed (2026-12-02).
    worker = workers("w1", clean_db.model_copy(update={"heartbeat_interval_s": 0.1}))
    dataset_id = register_demo(client, demo_root, worker)
    experiment_id = create_experiment(client, dataset_id, steps=STEPS, every=STEPS // 2)
    body = {"action": "train", "experiment_id": experiment_id}
    # The worker has no GPU: it offers clean_db.cpu_ranks (2) gloo ranks.
    refused = client.post("/jobs", json=body | {"options": {"gpus": 3}})
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"].startswith(
        "options.gpus: 3 ranks asked, the most a live worker offers is 2"
    )

    job_id = client.post("/jobs", json=body | {"options": {"gpus": 2}}).json()["id"]
    results = clean_db.data_root / "jobs" / str(job_id) / "results"
    wait_for(client, job_id, {"running"}, worker=worker, until=lambda j: j["progress"]["step"])
    assert set(rank_pids(results)) == {0, 1}
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 200
    job = wait_for(client, job_id, {"cancelled", "failed", "succeeded"}, worker=worker)
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["status"] == "cancelled", logs
    assert rank_pids(results) == {}
    step = job["result"]["step"]
    assert 1 <= step < STEPS and job["result"]["checkpoint"].endswith(f"model.step-{step}.pth")

    # Resumed from the checkpoint the cancel kept; once the group has trained a step, a
    # rank dies.
    assert client.post(f"/jobs/{job_id}/resume").status_code == 202
    wait_for(
        client, job_id, {"running"}, worker=worker, until=lambda j: j["progress"]["step"] > step
    )
    wait_until(lambda: 1 in rank_pids(results), timeout_s=30, what="rank 1")
    os.kill(rank_pids(results)[1], signal.SIGKILL)
    job = wait_for(client, job_id, {"succeeded", "failed"}, worker=worker)
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["status"] == "succeeded", logs
    assert job["attempts"] == 2 and job["progress"]["step"] == STEPS
    assert job["result"]["ranks"] == 2 and job["result"]["effective_batch"] == 4
    assert "torchrun restarted the ranks (restart 1): resuming" in logs
    # The ranks' lines name paths relative to the data root, as every job log line does.
    assert f"resuming from jobs/{job_id}/results/model.step-{step}.pth" in logs
    assert str(clean_db.data_root.resolve()) not in logs
    assert "2 process(es) x batch 2 x accumulate 1 = 4 images per step" in logs

    # The CLI on the spec the ranks trained, uninterrupted: the same weights and losses.
    cli_dir = _train_with_the_cli(results / "launch" / "spec.json", tmp_path_factory.mktemp("cli"))
    job_model = load_model(clean_db.data_root / job["result"]["checkpoint"]).model.state_dict()
    cli_model = load_model(cli_dir / f"model.step-{STEPS}.pth").model.state_dict()
    assert all(torch.equal(job_model[k], cli_model[k]) for k in cli_model)
    cli_status = (cli_dir / "status.json").read_text()
    assert f'"Total loss": {job["result"]["metrics"]["Total loss"]}' in cli_status


STEPS = 12
"""Enough that the cancel comes before the last step and that the resumed run still has
steps to train when its rank is killed."""


def _train_with_the_cli(spec: Path, cli_dir: Path) -> Path:
    """Train ``spec`` with the CLI's ``--gpus 2``, uninterrupted; its results folder."""
    maskops = Path(sys.executable).with_name("maskops")
    command = [str(maskops), "train", "-e", str(spec), "-d", str(cli_dir), "--gpus", "2"]
    run_ranks(command, cli_dir, timeout_s=300)
    return cli_dir


def test_two_workers_run_one_node_each_and_a_missing_node_requeues_the_job(
    client: TestClient,
    clean_db: Settings,
    workers: Callable[..., Worker],
    demo_root: str,
) -> None:
    settings = clean_db.model_copy(update={"rendezvous_timeout_s": 10.0})
    first, lost = workers("w1", settings), workers("w2", settings)
    dataset_id = register_demo(client, demo_root, first)
    experiment_id = create_experiment(client, dataset_id, steps=2, every=2)
    _wait_for_the_heartbeats_of_two_workers(clean_db)
    # w2 dies without a clean stop: its heartbeat row stays fresh, so the door accepts a
    # two-node job, but only one node comes to the rendezvous.
    lost.kill()
    body = {"action": "train", "experiment_id": experiment_id, "options": {"nodes": 2}}
    job_id = client.post("/jobs", json=body).json()["id"]
    job = wait_for(client, job_id, {"queued"}, worker=first, until=lambda j: bool(j["error"]))
    assert "the 2 hosts did not gather within 10 s" in job["error"], job

    # Two workers that wait long enough for each other (a loaded machine starts torchrun
    # slowly) replace them and the reconciler sends the job again: one worker leads it
    # (hosting the rendezvous), the other runs its second node.
    first.stop()
    patient = clean_db.model_copy(update={"rendezvous_timeout_s": 180.0})
    leader = workers("w3", patient)
    workers("w4", patient)
    _reconcile(clean_db)
    job = wait_for(client, job_id, {"succeeded", "failed"}, worker=leader, timeout=900)
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["status"] == "succeeded", logs
    assert job["attempts"] == 2 and job["result"]["ranks"] == 2
    assert "attempt 2: a node joins on" in logs
    assert "2 process(es) x batch 2 x accumulate 1 = 4 images per step" in logs


def test_a_node_lost_mid_run_requeues_the_job_with_its_reason_instead_of_hanging(
    client: TestClient,
    clean_db: Settings,
    workers: Callable[..., Worker],
    demo_root: str,
) -> None:
    """The worker running the second node of a ``nodes: 2`` job dies (SIGKILL; its torchrun
    gets the parent-death SIGTERM): the leader's ranks lose their peer, torchrun restarts
    the group, which cannot gather two hosts within the rendezvous timeout, and the job
    goes back to the queue with that reason (to resume from its checkpoint when sent
    again); no rank is left behind."""
    settings = clean_db.model_copy(update={"rendezvous_timeout_s": 15.0})
    pair = {"w1": workers("w1", settings), "w2": workers("w2", settings)}
    dataset_id = register_demo(client, demo_root, pair["w1"])
    experiment_id = create_experiment(client, dataset_id, steps=6, every=3)
    _wait_for_the_heartbeats_of_two_workers(clean_db)
    body = {"action": "train", "experiment_id": experiment_id, "options": {"nodes": 2}}
    job_id = client.post("/jobs", json=body).json()["id"]
    results = clean_db.data_root / "jobs" / str(job_id) / "results"
    wait_for(client, job_id, {"running"}, until=lambda j: j["progress"]["step"])
    wait_until(lambda: set(rank_pids(results)) == {0, 1}, timeout_s=30, what="both ranks")
    node, leader = sorted(pair.values(), key=lambda w: "] received" not in _node_tasks(w))
    node.kill()
    job = wait_for(client, job_id, {"queued", "failed"}, worker=leader, until=lambda j: j["error"])
    logs = client.get(f"/jobs/{job_id}/logs").text
    assert job["status"] == "queued", logs
    assert "the 2 hosts did not gather within 15 s" in job["error"], job
    assert "after a host left the run (rank " in job["error"], job
    wait_until(lambda: rank_pids(results) == {}, timeout_s=60, what="no rank left")


def _node_tasks(worker: Worker) -> str:
    """The lines of ``worker``'s log about the node tasks (``maskops.train.node``) it ran."""
    return "\n".join(line for line in worker.log().splitlines() if "maskops.train.node[" in line)


def _wait_for_the_heartbeats_of_two_workers(settings: Settings) -> None:
    """Until two workers offer 2 ranks each (the door wants them for a two-node job)."""
    engine = make_engine(settings)
    factory = make_session_factory(engine)

    def offers() -> list[int]:
        with factory() as session:
            return rank_offers(session, settings, settings.gpu_queue)

    try:
        wait_until(lambda: offers() == [2, 2], timeout_s=60, what="both workers' heartbeats")
    finally:
        engine.dispose()
