"""Deleting datasets, experiments, finished jobs and unpublished models.

Each delete removes its rows in one transaction and only then its files, so no row ever
points at files that are gone; a file that cannot be removed is logged and left behind
(the rows are gone already: the client's request did what it asked). A delete that other
rows still depend on is refused (409) naming them, before anything is removed; the
target row is locked first (Postgres) so that a dependant committed meanwhile is seen,
and one inserted later fails on its foreign key.

A registered dataset's own images and annotations are the user's and stay; an uploaded
dataset's extracted archive (``uploads/<id>``) goes with it unless another dataset
still reads from it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy import Text, cast, delete, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from maskops.path_rules import is_inside
from maskops.serving.protocol import EnsembleNames
from maskops_api.errors import Conflict, NotFound
from maskops_api.services import datasets, experiments, jobs
from maskops_core import automl
from maskops_core.actions import JobAction
from maskops_core.db.models import (
    TERMINAL_STATUSES,
    Dataset,
    Experiment,
    ExperimentVersion,
    IdempotencyKey,
    Job,
    JobMetric,
    PublishedModel,
)
from maskops_core.paths import remove_tree
from maskops_core.settings import Settings

log = logging.getLogger(__name__)

MAX_NAMED = 10
"""Dependants named in a refusal; the rest are counted."""
_UPLOAD = re.compile(r"[0-9a-f]{32}")


def delete_job(session: Session, settings: Settings, job_id: int) -> None:
    """Delete a finished job (its row, metrics and ``jobs/<id>`` folder)."""
    job = session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    _check_finished(job)
    _refuse(f"job {job_id}", _job_dependants(session, [job_id]))
    _delete_job_rows(session, [job_id])
    _commit(session, f"job {job_id}")
    _remove(settings.data_root, [settings.jobs_dir / str(job_id)])
    if job.action == JobAction.automl:
        _delete_study(settings, job_id)


def _delete_study(settings: Settings, search_job_id: int) -> None:
    """A deleted search's Optuna study goes with it (its trial jobs went before it)."""
    storage = automl.study_storage(settings)
    with contextlib.suppress(KeyError):  # none: the search never started
        storage.delete_study(storage.get_study_id_from_name(automl.study_name(search_job_id)))


def delete_dataset(session: Session, settings: Settings, dataset_id: int) -> list[int]:
    """Delete a dataset with its conversion jobs; returns the ids of the jobs deleted."""
    dataset = session.scalars(
        select(Dataset).where(Dataset.id == dataset_id).with_for_update()
    ).one_or_none()
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found")
    users = session.scalars(select(Job).where(Job.dataset_id == dataset_id).order_by(Job.id)).all()
    converts = [j for j in users if j.action == JobAction.dataset_convert]
    others = [f"job {j.id}" for j in users if j.action != JobAction.dataset_convert]
    used_by = session.scalars(
        select(Experiment.id).where(Experiment.dataset_id == dataset_id).order_by(Experiment.id)
    ).all()
    convert_ids = [j.id for j in converts]
    _refuse(
        f"dataset {dataset_id}",
        [f"experiment {i}" for i in used_by]
        + others
        + _job_dependants(session, convert_ids, dataset_id=dataset_id),
    )
    for job in converts:
        _check_finished(job)
    uploads = _own_uploads(session, settings, dataset)
    _delete_job_rows(session, convert_ids)
    _forget_keys(session, datasets.ENDPOINT, [dataset_id])
    session.execute(delete(Dataset).where(Dataset.id == dataset_id))
    _commit(session, f"dataset {dataset_id}")
    folders = [settings.data_root / "datasets" / str(dataset_id), *uploads]
    _remove(settings.data_root, folders + [settings.jobs_dir / str(i) for i in convert_ids])
    return convert_ids


def delete_experiment(session: Session, experiment_id: int) -> None:
    """Delete an experiment and its spec versions (it has no files)."""
    experiment = session.scalars(
        select(Experiment).where(Experiment.id == experiment_id).with_for_update()
    ).one_or_none()
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    users = session.scalars(
        select(Job.id).where(Job.experiment_id == experiment_id).order_by(Job.id)
    ).all()
    _refuse(f"experiment {experiment_id}", [f"job {i}" for i in users])
    session.execute(
        delete(ExperimentVersion).where(ExperimentVersion.experiment_id == experiment_id)
    )
    _forget_keys(session, experiments.ENDPOINT, [experiment_id])
    session.execute(delete(Experiment).where(Experiment.id == experiment_id))
    _commit(session, f"experiment {experiment_id}")


def delete_model(session: Session, settings: Settings, name: str) -> None:
    """Delete every version of an unpublished model: its rows, then the repository folders
    of the ensemble and its parts."""
    rows = session.scalars(
        select(PublishedModel)
        .where(PublishedModel.name == name)
        .order_by(PublishedModel.version)
        .with_for_update()
    ).all()
    if not rows:
        raise NotFound(f"model {name!r} not found")
    served = [str(r.version) for r in rows if r.published]
    if served:
        raise Conflict(
            f"model {name!r} is published (version {', '.join(served)}); unpublish it first"
        )
    _refuse(f"model {name!r}", [f"job {i}" for i in _publishing(session, name)])
    session.execute(delete(PublishedModel).where(PublishedModel.name == name))
    _commit(session, f"model {name!r}")
    names = EnsembleNames(name)
    folders = [settings.model_repository / n for n in (name, *names.parts)]
    _remove(settings.model_repository, folders)


def _check_finished(job: Job) -> None:
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(f"job {job.id} is {job.status}; cancel it first")


def _job_dependants(
    session: Session, job_ids: Sequence[int], *, dataset_id: int | None = None
) -> list[str]:
    """What still refers to these jobs: child jobs, models published from them, datasets
    they converted (but ``dataset_id``, deleted with them)."""
    if not job_ids:
        return []
    children = session.scalars(
        select(Job.id).where(Job.parent_job_id.in_(job_ids)).order_by(Job.id)
    ).all()
    models = session.execute(
        select(PublishedModel.name, PublishedModel.version)
        .where(PublishedModel.job_id.in_(job_ids))
        .order_by(PublishedModel.name, PublishedModel.version)
    ).all()
    converted = session.scalars(
        select(Dataset.id)
        .where(Dataset.convert_job_id.in_(job_ids), Dataset.id != (dataset_id or 0))
        .order_by(Dataset.id)
    ).all()
    return (
        [f"job {i}" for i in children if i not in job_ids]
        + [f"model {n!r} version {v}" for n, v in models]
        + [f"dataset {i}" for i in converted]
    )


def _publishing(session: Session, name: str) -> list[int]:
    """Publish jobs for ``name`` not finished yet (they would write its folders again)."""
    pending = session.scalars(
        select(Job).where(
            Job.action == JobAction.publish, Job.status.not_in(list(TERMINAL_STATUSES))
        )
    ).all()
    return sorted(j.id for j in pending if (j.options or {}).get("name") == name)


def _refuse(what: str, dependants: list[str]) -> None:
    if not dependants:
        return
    named = ", ".join(dependants[:MAX_NAMED])
    more = len(dependants) - MAX_NAMED
    if more > 0:
        named += f" and {more} more"
    raise Conflict(f"{what} is still used by {named}; delete those first")


def _delete_job_rows(session: Session, job_ids: list[int]) -> None:
    if not job_ids:
        return
    session.execute(delete(JobMetric).where(JobMetric.job_id.in_(job_ids)))
    # Keys of both routes that create jobs: POST /jobs and POST /models/{name}/publish.
    session.execute(
        delete(IdempotencyKey).where(
            or_(
                IdempotencyKey.endpoint == jobs.ENDPOINT,
                IdempotencyKey.endpoint.like(jobs.PUBLISH_ENDPOINT.format(name="%")),
            ),
            IdempotencyKey.resource_id.in_(job_ids),
        )
    )
    session.execute(delete(Job).where(Job.id.in_(job_ids)))


def _forget_keys(session: Session, endpoint: str, resource_ids: Iterable[int]) -> None:
    """Idempotency keys that created these resources: a retry with one of them would
    otherwise answer with a resource that is gone."""
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.endpoint == endpoint, IdempotencyKey.resource_id.in_(list(resource_ids))
        )
    )


def _commit(session: Session, what: str) -> None:
    try:
        session.commit()
    except IntegrityError:
        # A dependant inserted after the checks (its foreign key now refuses the delete).
        session.rollback()
        raise Conflict(f"{what} gained a dependant meanwhile; try again") from None


def _own_uploads(session: Session, settings: Settings, dataset: Dataset) -> list[Path]:
    """The ``uploads/<id>`` folders the dataset was extracted into and no other dataset
    mentions."""
    root = settings.data_root.resolve()
    found: set[Path] = set()
    for paths in dataset.splits.values():
        for relative in paths.values():
            parts = Path(str(relative)).parts
            if len(parts) < 2 or parts[0] != "uploads" or not _UPLOAD.fullmatch(parts[1]):
                continue
            folder = settings.data_root / "uploads" / parts[1]
            if is_inside(root / str(relative), folder):
                found.add(folder)
    return sorted(f for f in found if not _mentioned_elsewhere(session, dataset.id, f.name))


def _mentioned_elsewhere(session: Session, dataset_id: int, upload: str) -> bool:
    other = select(Dataset.id).where(
        Dataset.id != dataset_id, cast(Dataset.splits, Text).contains(upload)
    )
    return session.scalar(other.limit(1)) is not None


def _remove(root: Path, folders: Iterable[Path]) -> None:
    for folder in folders:
        try:
            remove_tree(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            where = folder.relative_to(root).as_posix()
            log.error("could not remove %s: %s", where, exc.strerror or type(exc).__name__)
