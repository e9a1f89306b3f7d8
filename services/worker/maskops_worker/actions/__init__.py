"""One function per job action, one module per action (``common`` holds what they share):
each turns a job into a call of the engine function that the CLI uses too, and returns the
job's result (JSON-able). No engine logic lives here.

Engine modules are imported inside the actions: a CPU worker converting datasets never
imports the model code. A declared task's job options become its engine options dataclass
in one place (:func:`~maskops_worker.actions.common.declared_job_options`).
"""

from __future__ import annotations

from maskops_worker.actions.automl import automl
from maskops_worker.actions.common import confine_trackers, job_options, job_spec, parent_model
from maskops_worker.actions.dataset import dataset_convert
from maskops_worker.actions.evaluate import evaluate
from maskops_worker.actions.export import export
from maskops_worker.actions.inference import inference
from maskops_worker.actions.prune import prune
from maskops_worker.actions.publish import publish
from maskops_worker.actions.train import train, train_node
from maskops_worker.contract import Action

__all__ = ["ACTIONS", "confine_trackers", "job_options", "job_spec", "parent_model", "train_node"]

ACTIONS: dict[str, Action] = {
    "dataset_convert": dataset_convert,
    "train": train,
    "evaluate": evaluate,
    "prune": prune,
    "inference": inference,
    "export": export,
    "publish": publish,
    "automl": automl,
}
"""The function of every catalogue action (``maskops_core.actions.JobAction``)."""
