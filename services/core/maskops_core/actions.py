"""The action catalogue: every kind of job, with what the control plane needs to know of it.

Each :class:`JobAction` member is one entry: its queue, the actions whose output it may
take as its parent, what it needs (an experiment, a dataset), the Celery task name that
runs it and the resources it uses. The API validates and routes jobs from here, the worker
registers one task per entry and routes by the same queue: adding an action is one entry
here plus its function in the worker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Self

from maskops_core.options import (
    ActionOptions,
    AutomlOptions,
    EvaluateOptions,
    ExportOptions,
    InferenceOptions,
    NoOptions,
    PruneOptions,
    PublishOptions,
    TrainOptions,
)
from maskops_core.settings import Settings

QueueKind = Literal["gpu", "cpu"]
"""``gpu``: one job per GPU worker (training owns its device); ``cpu``: the rest."""


@dataclass(frozen=True)
class ActionSpec:
    """What the control plane knows of one action."""

    queue: QueueKind
    parents: frozenset[str] = frozenset()
    """Actions whose succeeded output this one may take (empty: it takes no parent)."""
    needs_experiment: bool = False
    needs_dataset: bool = False
    needs_converted_dataset: bool = False
    resources: frozenset[str] = frozenset()
    """What a worker must have: ``gpu`` (a device, CPU fallback), ``model_repository``
    (the Triton model repository mounted)."""
    options: type[ActionOptions] = NoOptions
    """The job's ``options``: validated with this model by the API, read through it by
    the worker (see :mod:`maskops_core.options`)."""


_MODEL_MAKERS = frozenset({"train", "prune"})
_GPU = frozenset({"gpu"})


class JobAction(enum.StrEnum):
    """What a job does."""

    # Each member carries its ActionSpec (queue, parents, needs, resources).
    spec: ActionSpec

    def __new__(cls, value: str, spec: ActionSpec) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.spec = spec
        return member

    dataset_convert = "dataset_convert", ActionSpec(queue="cpu", needs_dataset=True)
    train = (
        "train",
        ActionSpec(
            queue="gpu",
            needs_experiment=True,
            needs_converted_dataset=True,
            resources=_GPU,
            options=TrainOptions,
        ),
    )
    evaluate = (
        "evaluate",
        ActionSpec(
            queue="gpu",
            parents=_MODEL_MAKERS,
            needs_experiment=True,
            resources=_GPU,
            options=EvaluateOptions,
        ),
    )
    prune = (
        "prune",
        ActionSpec(queue="gpu", parents=_MODEL_MAKERS, resources=_GPU, options=PruneOptions),
    )
    inference = (
        "inference",
        ActionSpec(
            queue="gpu",
            parents=_MODEL_MAKERS,
            needs_experiment=True,
            resources=_GPU,
            options=InferenceOptions,
        ),
    )
    export = (
        "export",
        ActionSpec(
            queue="gpu",
            parents=_MODEL_MAKERS,
            needs_experiment=True,
            resources=_GPU,
            options=ExportOptions,
        ),
    )
    automl = (
        "automl",
        # The search's controller: it creates its trials (train jobs, on the GPU queue) and
        # waits for them, using no device itself.
        ActionSpec(
            queue="cpu",
            needs_experiment=True,
            needs_converted_dataset=True,
            options=AutomlOptions,
        ),
    )
    publish = (
        "publish",
        ActionSpec(
            queue="cpu",
            # An export's graph; a train or prune job's checkpoint for the torch backend.
            parents=frozenset({"export", *_MODEL_MAKERS}),
            resources=frozenset({"model_repository"}),
            options=PublishOptions,
        ),
    )

    @classmethod
    def named(cls, value: str) -> JobAction:
        """The member for a stored value (members are named as their values)."""
        return cls[value]

    @property
    def task_name(self) -> str:
        """The Celery task that runs this action (the API sends by this name only)."""
        return f"maskops.{self.value}"

    def queue(self, settings: Settings) -> str:
        """The broker queue this action's jobs go to."""
        return settings.gpu_queue if self.spec.queue == "gpu" else settings.cpu_queue


TRAIN_NODE_TASK = "maskops.train.node"
"""The Celery task running one more node (host) of a multi-node train job: the worker
leading the job sends one per other node, to the train queue. Not an action: it never owns
the job."""


def task_routes(settings: Settings) -> dict[str, dict[str, str]]:
    """Celery's ``task_routes`` for every action (and the train nodes): producers and
    consumers route alike."""
    routes = {action.task_name: {"queue": action.queue(settings)} for action in JobAction}
    return routes | {TRAIN_NODE_TASK: {"queue": JobAction.train.queue(settings)}}


def dispatch_task_id(job_id: int, attempt: int) -> str:
    """The Celery task id of a job's ``attempt``-th message (the reconciler looks for it)."""
    return f"maskops-job-{job_id}-{attempt}"


def stack_kwargs(stack_id: str, database: str = "") -> dict[str, str]:
    """The keyword arguments naming the sending stack and the database holding the job in
    a task message (none of either when empty: such messages are what workers of every
    version accept). A worker sends a message naming another stack or another database
    back to the broker (maskops_worker/tasks.py, :mod:`maskops_core.identity`)."""
    return ({"stack": stack_id} if stack_id else {}) | ({"database": database} if database else {})
