"""The action catalogue: one entry per action decides its queue, its Celery task and what
its messages carry."""

from __future__ import annotations

from pathlib import Path

from maskops_core.actions import (
    TRAIN_NODE_TASK,
    JobAction,
    dispatch_task_id,
    stack_kwargs,
    task_routes,
)
from maskops_core.settings import Settings


def test_every_action_is_routed_to_its_kind_of_queue(settings: Settings) -> None:
    routes = task_routes(settings)
    for action in JobAction:
        expected = settings.gpu_queue if action.spec.queue == "gpu" else settings.cpu_queue
        assert routes[action.task_name] == {"queue": expected}
        assert action.queue(settings) == expected
    assert routes[TRAIN_NODE_TASK] == routes[JobAction.train.task_name]
    assert len(routes) == len(JobAction) + 1


def test_the_queue_names_follow_the_settings_prefix(tmp_path: Path) -> None:
    settings = Settings(queue_prefix="lab_", data_root=tmp_path, _env_file=None)  # type: ignore[call-arg]
    assert JobAction.train.queue(settings) == "lab_gpu"
    assert JobAction.publish.queue(settings) == "lab_cpu"


def test_actions_that_run_a_model_take_a_trained_or_pruned_parent() -> None:
    for action in (JobAction.evaluate, JobAction.prune, JobAction.inference, JobAction.export):
        assert action.spec.parents == {"train", "prune"}
        assert "gpu" in action.spec.resources
    # An export's graph, or (the torch net backend) a train or prune job's checkpoint.
    assert JobAction.publish.spec.parents == {"export", "train", "prune"}
    assert not JobAction.train.spec.parents and JobAction.train.spec.needs_converted_dataset
    # The search's controller waits for its trials and holds no device.
    assert JobAction.automl.spec.queue == "cpu" and not JobAction.automl.spec.resources


def test_stored_values_name_their_members_and_tasks() -> None:
    for action in JobAction:
        assert JobAction.named(str(action)) is action
        assert action.task_name == f"maskops.{action}"


def test_task_ids_and_message_keywords() -> None:
    assert dispatch_task_id(12, 3) == "maskops-job-12-3"
    assert stack_kwargs("") == {}
    assert stack_kwargs("a", "db-1") == {"stack": "a", "database": "db-1"}
    assert stack_kwargs("", "db-1") == {"database": "db-1"}
