"""AutoML searches as the API shows them: the search job, its trials (the study's trials
joined with their train jobs) and the best one, with its spec as TAO text and its
checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from maskops.spec.models import ExperimentSpec
from maskops_api.errors import NotFound
from maskops_api.schemas import AutomlOut, JobCreate, TrialOut
from maskops_api.services import jobs
from maskops_api.specs import spec_to_text
from maskops_core import automl as searches
from maskops_core import experiments as versions
from maskops_core.actions import JobAction
from maskops_core.db.models import TERMINAL_STATUSES, Job, JobStatus
from maskops_core.settings import Settings

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

ENDPOINT = "POST /automl"


def search_body(experiment_id: int, **fields: Any) -> JobCreate:
    """The ``automl`` job a ``POST /automl`` body asks for."""
    return JobCreate(action=JobAction.automl, experiment_id=experiment_id, **fields)


def get_search(session: Session, job_id: int) -> Job:
    job = jobs.get_job(session, job_id)
    if job.action != JobAction.automl:
        raise NotFound(f"no automl search {job_id}: job {job_id} is {jobs.a_job(job.action)}")
    return job


def _study_trials(
    settings: Settings, job_id: int
) -> tuple[dict[str, Any], str | None, list[FrozenTrial]]:
    """The study's settings, direction and trials (none yet for a search not started)."""
    storage = searches.study_storage(settings)
    try:
        study_id = storage.get_study_id_from_name(searches.study_name(job_id))
    except KeyError:
        return {}, None, []
    direction = storage.get_study_directions(study_id)[0].name.lower()
    attrs = storage.get_study_user_attrs(study_id)
    return attrs, direction, storage.get_all_trials(study_id, deepcopy=False)


def search_view(session: Session, settings: Settings, job_id: int) -> AutomlOut:
    job = get_search(session, job_id)
    attrs, direction, trials = _study_trials(settings, job_id)
    children = {
        int((child.options or {}).get("trial", -1)): child
        for child in session.scalars(
            select(Job).where(Job.parent_job_id == job_id, Job.action == JobAction.train)
        )
    }
    searching = job.status not in TERMINAL_STATUSES
    out = [_trial_out(trial, children.get(trial.number), searching) for trial in trials]
    complete = [t for t in out if t.state == "complete" and t.value is not None]
    best = None
    if complete:
        pick = min if direction == "minimize" else max
        best = pick(complete, key=lambda t: t.value or 0.0)
    spec_text, checkpoint = _best_artifacts(session, job, best, children)
    return AutomlOut(
        job=jobs.job_out(job),
        algorithm=attrs.get("algorithm"),
        sampler=attrs.get("sampler"),
        pruner=attrs.get("pruner"),
        metric=attrs.get("metric"),
        direction=direction,
        trials=out,
        best=best,
        best_spec_text=spec_text,
        best_checkpoint=checkpoint,
    )


INTERRUPTED = "interrupted"
"""A trial the study still counts running while its search is not (cancelled, failed):
resuming the search resumes it."""


def _trial_out(trial: FrozenTrial, child: Job | None, searching: bool) -> TrialOut:
    state = trial.state.name.lower()
    return TrialOut(
        number=trial.number,
        state=INTERRUPTED if state == "running" and not searching else state,
        params=dict(trial.params),
        value=trial.value if trial.state.name == "COMPLETE" else None,
        intermediate={str(k): v for k, v in sorted(trial.intermediate_values.items())},
        job_id=child.id if child else None,
        job_status=JobStatus(child.status) if child else None,
        experiment_version=child.experiment_version if child else None,
    )


def _best_artifacts(
    session: Session, search: Job, best: TrialOut | None, children: dict[int, Job]
) -> tuple[str | None, str | None]:
    if best is None or best.number not in children or search.experiment_id is None:
        return None, None
    child = children[best.number]
    version = versions.find_version(session, search.experiment_id, child.experiment_version or 0)
    text = spec_to_text(ExperimentSpec.model_validate(version.spec)) if version else None
    return text, (child.result or {}).get("checkpoint")
