"""Job writes: create (validated, idempotent), cancel, resume; and the job's public view."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.orm import Session

from maskops.spec.models import ExperimentSpec
from maskops_api.errors import Conflict, Invalid, NotFound
from maskops_api.schemas import JobCreate, JobOut, Progress
from maskops_api.services import idempotency
from maskops_api.services.experiments import check_server_rules
from maskops_api.specs import SpecError
from maskops_core import experiments as versions
from maskops_core import job_state, workers
from maskops_core.actions import JobAction
from maskops_core.db.models import (
    TERMINAL_STATUSES,
    Dataset,
    Experiment,
    ExperimentVersion,
    Job,
    JobStatus,
    utcnow,
)
from maskops_core.db.session import rowcount
from maskops_core.options import AutomlJob, AutomlOptions, TrainJob, TrainOptions
from maskops_core.settings import Settings

ENDPOINT = "POST /jobs"
PUBLISH_ENDPOINT = "POST /models/{name}/publish"
"""Publishing queues a job too: the keys of both endpoints name a job."""


def create_job(
    session: Session,
    settings: Settings,
    body: JobCreate,
    *,
    idempotency_key: str | None,
    endpoint: str = ENDPOINT,
) -> tuple[Job, bool]:
    """Insert a queued job; returns ``(job, created)`` (False when replaying a key).

    ``endpoint`` scopes the key: one key sent to two routes names two requests.
    """
    body_hash = idempotency.request_hash(body.model_dump(mode="json"))
    if idempotency_key:
        existing = idempotency.replayed(
            session, Job, key=idempotency_key, endpoint=endpoint, body_hash=body_hash
        )
        if existing is not None:
            return existing, False
    job = _validated_job(session, settings, body)
    session.add(job)
    session.flush()
    winner = idempotency.commit_remembering(
        session, key=idempotency_key, endpoint=endpoint, body_hash=body_hash, resource_id=job.id
    )
    if winner is not None:
        return session.get_one(Job, winner), False
    return job, True


def _validated_job(session: Session, settings: Settings, body: JobCreate) -> Job:
    action = body.action
    parent = _parent(session, action, body.parent_job_id)
    experiment, version = _experiment_version(session, action, body, parent)
    dataset_id = body.dataset_id
    if dataset_id is None and experiment is not None:
        dataset_id = experiment.dataset_id
    _check_dataset(session, action, dataset_id)
    _check_options(action, body.options)
    if action == JobAction.train:
        _check_ranks(session, settings, action, TrainOptions.model_validate(body.options))
    if action in (JobAction.train, JobAction.automl) and version is not None:
        _check_trains(version)
    if action == JobAction.train and body.options.get("trial") is not None:
        raise Invalid("options.trial: set by an AutoML search on its own trials only")
    if action == JobAction.automl and version is not None:
        check_search_space(settings, version, AutomlOptions.model_validate(body.options))
    if action == JobAction.publish and parent is not None:
        _check_publish_source(settings, parent)
    return job_state.queued_job(
        action,
        queue=action.queue(settings),
        options=body.options,
        experiment_id=experiment.id if experiment else None,
        experiment_version=version.version if version else None,
        dataset_id=dataset_id,
        parent_job_id=parent.id if parent else None,
    )


def _parent(session: Session, action: JobAction, parent_job_id: int | None) -> Job | None:
    """The job whose output ``action`` takes, checked against the catalogue's parents."""
    parent = None
    if parent_job_id is not None:
        parent = session.get(Job, parent_job_id)
        if parent is None:
            raise NotFound(f"parent job {parent_job_id} not found")
    allowed = action.spec.parents
    if not allowed:
        return parent
    if parent is None:
        raise Invalid(f"{action} needs parent_job_id ({a_job(' or '.join(sorted(allowed)))})")
    if parent.action not in allowed:
        # The parent exists but is of another kind: its state, not the request, is wrong
        # (409, as a parent that has not succeeded).
        raise Conflict(f"{action} cannot use {a_job(parent.action)}'s output (job {parent.id})")
    if parent.status == JobStatus.cancelled and action == JobAction.evaluate:
        # A training cancelled after its first checkpoint keeps it: worth evaluating.
        if not (parent.result or {}).get("checkpoint"):
            raise Conflict(f"parent job {parent.id} was cancelled before writing a checkpoint")
    elif parent.status != JobStatus.succeeded:
        raise Conflict(f"parent job {parent.id} is {parent.status}, not succeeded")
    return parent


def a_job(action: str) -> str:
    """``"an evaluate job"``, ``"a train job"``: an action's jobs named in a message."""
    return f"{'an' if action[:1] in 'aeiou' else 'a'} {action} job"


def served_net_backend(settings: Settings) -> str:
    """The net backend publishes get (``auto``: onnxruntime on GPUs, python on CPUs, as
    ``maskops.serving.placement.Placement.default_net_backend``)."""
    if settings.triton_net_backend != "auto":
        return settings.triton_net_backend
    return "onnxruntime" if settings.triton_device == "gpu" else "python"


def _check_publish_source(settings: Settings, parent: Job) -> None:
    """Refuse a parent the configured net backend cannot serve: a train or prune job's
    checkpoint needs the torch backend (which also serves the checkpoint an export was
    made from), the others serve an export's graph."""
    backend = served_net_backend(settings)
    if parent.action in ("train", "prune") and backend != "torch":
        raise Invalid(
            f"parent_job_id: job {parent.id} is a {parent.action} job, whose checkpoint the "
            f"torch net backend serves (MASKOPS_TRITON_NET_BACKEND=torch); this server "
            f"publishes with {backend}: publish an export job"
        )


def _experiment_version(
    session: Session, action: JobAction, body: JobCreate, parent: Job | None
) -> tuple[Experiment | None, ExperimentVersion | None]:
    """The experiment version the job runs: the body's, else its parent's, else the
    experiment's default one."""
    experiment_id = body.experiment_id
    if experiment_id is None and parent is not None:
        experiment_id = parent.experiment_id
    if experiment_id is None:
        if not action.spec.needs_experiment:
            return None, None
        if parent is None:
            raise Invalid(f"{action} needs experiment_id")
        # The body is well formed (a parent brings its experiment); this parent has none.
        raise Conflict(f"parent job {parent.id} has no experiment: give experiment_id")
    experiment = session.get(Experiment, experiment_id)
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    wanted = body.experiment_version
    if wanted is None and body.experiment_id is None and parent is not None:
        wanted = parent.experiment_version
    # None: the newest version a user made, never an AutoML search's trial version.
    version = versions.version_or_default(session, experiment.id, wanted)
    if version is None:
        raise NotFound(f"experiment {experiment.id} has no version {wanted or 'of its own'}")
    return experiment, version


def _check_dataset(session: Session, action: JobAction, dataset_id: int | None) -> None:
    if dataset_id is None:
        if action.spec.needs_dataset:
            raise Invalid(f"{action} needs dataset_id")
        return
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found")
    if action.spec.needs_converted_dataset and dataset.shards_dir is None:
        raise Conflict(f"dataset {dataset.id} is not converted yet (job {dataset.convert_job_id})")


def _check_options(action: JobAction, options: dict[str, object]) -> None:
    """The options through the model the worker reads them with (the catalogue's)."""
    try:
        action.spec.options.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("options", *first["loc"]))
        raise Invalid(f"{where}: {first['msg']} ({action} options)") from None


def _check_ranks(
    session: Session, settings: Settings, action: JobAction, job_options: TrainJob
) -> None:
    """A job on several ranks needs live workers offering them (``nodes`` workers of
    ``gpus`` ranks each): refused now rather than queued for workers that never come (one
    rank always queues). A 409: the options are valid, the live workers are the state
    that does not allow them."""
    options = job_options.engine()
    if options.gpus == 1 and options.nodes == 1:
        return
    queue = action.queue(settings)
    offers = workers.rank_offers(session, settings, queue)
    rule = f"(its GPUs, or {settings.cpu_ranks} without a GPU: MASKOPS_CPU_RANKS)"
    if options.gpus > (offers[0] if offers else 1):
        most = f"the most a live worker offers is {offers[0]}" if offers else "no live worker"
        raise Conflict(f"options.gpus: {options.gpus} ranks asked, {most} on queue {queue} {rule}")
    enough = sum(1 for offer in offers if offer >= options.gpus)
    if enough < options.nodes:
        raise Conflict(
            f"options.nodes: {options.nodes} nodes of {options.gpus} rank(s) asked, {enough} "
            f"live worker(s) on queue {queue} offer that many {rule}"
        )


def _check_trains(version: ExperimentVersion) -> None:
    """A train job needs steps to run; a spec may leave them at 0 for evaluation only (a
    409: the experiment version, not the request, is what does not allow it)."""
    try:
        spec = ExperimentSpec.model_validate(version.spec)
    except ValidationError:
        return  # a version stored by an older engine: the worker names what is wrong
    if spec.resolved_total_steps < 1:
        raise Conflict(
            f"spec.total_steps: experiment version {version.version} trains 0 steps "
            "(set total_steps, or num_epochs with num_examples_per_epoch)"
        )


def check_search_space(settings: Settings, version: ExperimentVersion, options: AutomlJob) -> None:
    """Every searched field must be a field of the spec schema with values it allows, and
    every choice and both ends of every range must make a spec this server accepts from
    ``POST /experiments`` (its limits, paths and trackers): 422 naming the field."""
    from maskops.automl.space import SpaceError, apply_params, resolve_space

    try:
        base = ExperimentSpec.model_validate(version.spec)
    except ValidationError:
        return  # a version stored by an older engine: the worker names what is wrong
    try:
        space = resolve_space(
            options.search_space(),
            base,
            overrides=options.range_overrides(),
            remove=options.remove_hyperparameters,
        )
    except SpaceError as exc:
        raise Invalid(f"options.hyperparameters.{exc}") from None
    for param in space:
        for value in param.values():
            try:
                spec = apply_params(base, {param.path: value})
                check_server_rules(spec, source="options.hyperparameters", settings=settings)
            except SpecError as exc:
                where = "" if exc.field == param.path else f" (makes {exc.field})"
                raise Invalid(
                    f"options.hyperparameters.{param.path}: {value!r}{where}: {exc.message}"
                ) from None


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def cancel_job(session: Session, job_id: int) -> Job:
    """A queued job is cancelled at once; a running one stops at its next step."""
    job = get_job(session, job_id)
    now = utcnow()
    if job.status in TERMINAL_STATUSES:
        raise Conflict(f"job {job_id} already {job.status}")
    values = job_state.cancel_values(job.status, now)
    if values is None:
        return job
    where = Job.id == job_id, Job.status == job.status
    changed = rowcount(session.execute(update(Job).where(*where).values(**values)))
    session.commit()
    session.refresh(job)
    if not changed:
        # The job moved on meanwhile (claimed, or finished); answer from its new state.
        return cancel_job(session, job_id) if job.status not in TERMINAL_STATUSES else job
    return job


def resume_job(session: Session, job_id: int) -> Job:
    """Queue a failed or cancelled training job again; it continues from its checkpoint.
    A search resumes too: where it was, with its finished trials."""
    job = get_job(session, job_id)
    if job.action not in (JobAction.train, JobAction.automl):
        raise Conflict(f"job {job_id} is {a_job(job.action)}; only train and automl jobs resume")
    if job.status not in (JobStatus.failed, JobStatus.cancelled):
        raise Conflict(f"job {job_id} is {job.status}; only failed or cancelled jobs resume")
    now = utcnow()
    changed = rowcount(
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == job.status)
            .values(status=JobStatus.queued, error=None, finished_at=None, updated_at=now)
        )
    )
    session.commit()
    session.refresh(job)
    if not changed:
        raise Conflict(f"job {job_id} changed state meanwhile ({job.status})")
    return job


def job_json(job: Job) -> bytes:
    """The job's public view as the JSON body of ``GET /jobs/{id}`` (ETA as of now)."""
    return job_out(job).model_dump_json().encode()


def eta_depends_on_time(job: Job) -> bool:
    """Whether the job's view changes with the clock alone (a running job's ETA)."""
    return eta_seconds(job, now=utcnow()) is not None


def eta_seconds(job: Job, *, now: datetime) -> float | None:
    """Seconds left at the average rate since progress reporting started, or None when
    the job is not running or has made no progress since."""
    step, total = job.progress_step, job.progress_total
    since, since_step = job.progress_started_at, job.progress_started_step
    if (
        job.status != JobStatus.running
        or step is None
        or not total
        or since is None
        or since_step is None
        or step <= since_step
    ):
        return None
    rate = (now - since).total_seconds() / (step - since_step)
    return max(0.0, rate * (total - step))


def job_out(job: Job, *, now: datetime | None = None) -> JobOut:
    step, total = job.progress_step, job.progress_total
    fraction = step / total if step is not None and total else None
    eta = eta_seconds(job, now=now or utcnow())
    return JobOut(
        id=job.id,
        action=JobAction.named(job.action),
        status=JobStatus(job.status),
        experiment_id=job.experiment_id,
        experiment_version=job.experiment_version,
        dataset_id=job.dataset_id,
        parent_job_id=job.parent_job_id,
        options=job.options or {},
        queue=job.queue,
        attempts=job.attempts,
        progress=Progress(step=step, total=total, fraction=fraction, eta_seconds=eta),
        latest_metrics=job.latest_metrics,
        result=job.result,
        error=job.error,
        worker_id=job.worker_id,
        heartbeat_at=job.heartbeat_at,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
