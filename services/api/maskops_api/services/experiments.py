"""Experiment writes: create from a JSON or TAO text spec; update makes a new version."""

from __future__ import annotations

from sqlalchemy.orm import Session

from maskops.spec.models import ExperimentSpec
from maskops_api.errors import NotFound
from maskops_api.schemas import ExperimentCreate, ExperimentOut, ExperimentUpdate
from maskops_api.services import idempotency
from maskops_api.specs import (
    check_limits,
    check_paths,
    check_trackers,
    spec_from_json,
    spec_from_text,
)
from maskops_core import experiments as versions
from maskops_core.db.models import Dataset, Experiment, ExperimentVersion, utcnow
from maskops_core.settings import Settings


def _parse(
    spec: dict[str, object] | None, spec_text: str | None, settings: Settings
) -> ExperimentSpec:
    """The spec, held to this server's limits and paths (SpecError naming the field)."""
    if spec_text is not None:
        parsed, source = spec_from_text(spec_text), "spec_text"
    else:
        assert spec is not None
        parsed, source = spec_from_json(dict(spec)), "spec"
    check_server_rules(parsed, source=source, settings=settings)
    return parsed


def check_server_rules(spec: ExperimentSpec, *, source: str, settings: Settings) -> None:
    """This server's limits, path confinement and trackers, beyond the spec schema
    (SpecError naming the field): every spec a job may run passes them."""
    check_limits(spec, source=source)
    check_paths(spec, source=source, allowed_dirs=settings.pretrained_dirs)
    check_trackers(spec, source=source, allowed=settings.trackers)


ENDPOINT = "POST /experiments"


def create_experiment(
    session: Session,
    settings: Settings,
    body: ExperimentCreate,
    *,
    idempotency_key: str | None = None,
) -> Experiment:
    body_hash = idempotency.request_hash(body.model_dump(mode="json"))
    if idempotency_key:
        existing = idempotency.replayed(
            session, Experiment, key=idempotency_key, endpoint=ENDPOINT, body_hash=body_hash
        )
        if existing is not None:
            return get_experiment(session, existing.id)
    parsed = _parse(body.spec, body.spec_text, settings)
    if body.dataset_id is not None and session.get(Dataset, body.dataset_id) is None:
        raise NotFound(f"dataset {body.dataset_id} not found")
    experiment = Experiment(name=body.name, dataset_id=body.dataset_id, last_version_number=1)
    session.add(experiment)
    session.flush()
    session.add(
        ExperimentVersion(
            experiment_id=experiment.id, version=1, spec=parsed.model_dump(mode="json")
        )
    )
    winner = idempotency.commit_remembering(
        session,
        key=idempotency_key,
        endpoint=ENDPOINT,
        body_hash=body_hash,
        resource_id=experiment.id,
    )
    if winner is not None:
        return get_experiment(session, winner)
    return experiment


def update_experiment(
    session: Session, settings: Settings, experiment_id: int, body: ExperimentUpdate
) -> Experiment:
    experiment = get_experiment(session, experiment_id)
    if body.name is not None:
        experiment.name = body.name
    if body.spec is not None or body.spec_text is not None:
        parsed = _parse(body.spec, body.spec_text, settings)
        # The next number after every one given out, the trials' of a search too.
        versions.add_version(session, experiment.id, parsed.model_dump(mode="json"))
    experiment.updated_at = utcnow()
    session.commit()
    return experiment


def get_experiment(session: Session, experiment_id: int) -> Experiment:
    experiment = session.get(Experiment, experiment_id)
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    return experiment


def get_version(session: Session, experiment: Experiment, version: int | None) -> ExperimentVersion:
    """Version ``version`` of the experiment; None: its default version (the newest one a
    user made, :func:`maskops_core.experiments.default_version`)."""
    found = versions.version_or_default(session, experiment.id, version)
    if found is None:
        raise NotFound(f"experiment {experiment.id} has no version {version or 'of its own'}")
    return found


def experiment_out(
    session: Session, experiment: Experiment, version: int | None = None
) -> ExperimentOut:
    """The experiment with version ``version``'s spec (None: its default version's)."""
    latest = get_version(session, experiment, None)
    shown = (
        latest if version in (None, latest.version) else get_version(session, experiment, version)
    )
    return ExperimentOut(
        id=experiment.id,
        name=experiment.name,
        dataset_id=experiment.dataset_id,
        version=shown.version,
        latest_version=latest.version,
        search_job_id=shown.search_job_id,
        spec=shown.spec,
        created_at=experiment.created_at,
        updated_at=experiment.updated_at,
    )
