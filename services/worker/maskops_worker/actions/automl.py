"""The ``automl`` action: an AutoML search's controller."""

from __future__ import annotations

from typing import Any

from maskops_core.options import AutomlOptions
from maskops_worker.actions.common import job_options, job_spec
from maskops_worker.contract import JobContext


def automl(ctx: JobContext) -> dict[str, Any]:
    """An AutoML search's controller (:mod:`maskops_worker.automl`): runs until each of
    its trials (train jobs) has ended; returns the best."""
    from maskops_worker.automl import run_search

    options = job_options(ctx, AutomlOptions)
    job_spec(ctx)  # the experiment must train: data paths, a dataset (as its trials need)
    return run_search(ctx, options)
