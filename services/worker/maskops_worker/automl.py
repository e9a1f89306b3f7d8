"""The ``automl`` action: a search's controller, and the pruning hook of its trials.

The controller asks the study (Optuna, in the control-plane database) for trials, creates
each as a train job (a child of the search, on a new version of the experiment holding the
trial's spec, marked as the search's) sent to the GPU queue like any other job
(:func:`maskops_core.dispatch.dispatch_job`), and tells the study each trial's
outcome once its job has ended: its final metric, pruned (its pruner stopped it) or failed.
It keeps no state of its own: restarted (its worker was killed, the reconciler sent it
again), it re-derives the search from the jobs and the study and carries on, never asking
for a trial twice nor losing a finished one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maskops.automl.search import trial_spec
from maskops.automl.space import Param, SpaceError, resolve_space
from maskops.automl.study import (
    PRUNED_REASON,
    PruningHook,
    SearchSettings,
    load_study,
    open_study,
    trial_reporter,
)
from maskops.spec.models import ExperimentSpec
from maskops_core import automl as searches
from maskops_core.actions import JobAction
from maskops_core.dispatch import CeleryDispatcher, Dispatcher, dispatch_job
from maskops_core.options import AutomlJob, TrainJob
from maskops_core.paths import check_client_path
from maskops_core.settings import Settings
from maskops_worker.contract import JobCancelled, JobContext, JobInputError, JobRequeued

if TYPE_CHECKING:
    import optuna

POLL_INTERVAL_S = 1.0
"""How often the controller looks at its trials' jobs."""


def search_settings(options: AutomlJob, base: ExperimentSpec) -> SearchSettings:
    return SearchSettings(
        algorithm=options.algorithm,
        sampler=options.sampler or "",
        pruner=options.pruner or "",
        metric=options.metric,
        min_resource=max(1, base.num_steps_per_eval),
        max_resource=max(1, base.resolved_total_steps),
        reduction_factor=options.reduction_factor,
        seed=options.seed,
    )


def search_space(options: AutomlJob, base: ExperimentSpec, settings: Settings) -> list[Param]:
    """The options' search space checked against the spec, its path choices confined as
    a client's paths are (a JobInputError names the field: the API checked it at the door
    with the server's limits too, this holds for jobs stored before)."""
    try:
        space = resolve_space(
            options.search_space(),
            base,
            overrides=options.range_overrides(),
            remove=options.remove_hyperparameters,
        )
    except SpaceError as exc:
        raise JobInputError(f"options.hyperparameters.{exc}") from None
    path_fields = {*base.PATH_FIELDS, *(f"data_config.{f}" for f in base.data_config.PATH_FIELDS)}
    for param in space:
        for value in param.values() if param.path in path_fields else ():
            try:
                if isinstance(value, str) and value:
                    check_client_path(value, allowed_dirs=settings.pretrained_dirs)
            except ValueError as exc:
                raise JobInputError(f"options.hyperparameters.{param.path}: {exc}") from None
    return space


@dataclass
class Search:
    """One pass of the controller over its trials, repeated until the search is done."""

    ctx: JobContext
    options: AutomlJob
    base: ExperimentSpec
    space: list[Param]
    study: optuna.Study
    dispatcher: Dispatcher
    reported: tuple[int, dict[str, float] | None] | None = None

    def run(self) -> dict[str, Any]:
        while True:
            if self.ctx.cancel_requested:
                cancelled = searches.cancel_trials(self.ctx.factory, self.ctx.job.id)
                self._log(f"cancelled; trial jobs cancelled: {cancelled}")
                raise JobCancelled(self.summary())
            limit = self.ctx.settings.max_running_searches
            if searches.must_yield(self.ctx.factory, self.ctx.job.id, limit):
                # Its trials keep their jobs; resumed, the controller re-derives the search.
                raise JobRequeued(f"waiting: at most {limit} searches run at once here")
            if self.step():
                return self.summary()
            self.ctx.stop_event.wait(POLL_INTERVAL_S)

    def step(self) -> bool:
        """Tell the study what ended, start what is missing; True once every trial is
        finished."""
        import optuna

        jobs = {job.trial: job for job in searches.trial_jobs(self.ctx.factory, self.ctx.job.id)}
        for job in jobs.values():
            if job.finished:
                self._tell(job)
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for trial in running:
            if trial.number not in jobs or not jobs[trial.number].dispatch_count:
                self._start(trial.number, trial.params)
        started, open_trials = len(self.study.trials), len(running)
        wanted = self.options.max_recommendations
        while open_trials < self.options.max_concurrent and started < wanted:
            asked = self.study.ask({p.path: p.distribution() for p in self.space})
            self._start(asked.number, asked.params)
            open_trials, started = open_trials + 1, started + 1
        progress = (started - open_trials, self._best_value())
        if progress != self.reported:
            self.ctx.report(progress[0], wanted, progress[1])
            self.reported = progress
        return started >= wanted and not open_trials

    def _start(self, number: int, params: dict[str, Any]) -> None:
        """Create (or find) the trial's train job and send it to the GPU queue."""
        spec = trial_spec(self.base, params, self.options.metric)
        job = searches.create_trial_job(
            self.ctx.factory,
            self.ctx.job.id,
            trial=number,
            spec=spec.model_dump(mode="json"),
            options={},
            queue=JobAction.train.queue(self.ctx.settings),
        )
        if job.dispatch_count:
            return
        if not dispatch_job(self.ctx.factory, self.dispatcher, job):
            return  # still queued and unsent: the next pass (or the reconciler) sends it
        self._log(
            f"trial {number}: job {job.id} (experiment version {job.experiment_version}) {params}"
        )

    def _tell(self, job: searches.TrialJob) -> None:
        """The study learns how trial ``job.trial`` ended (once: a finished trial stays)."""
        import optuna

        State = optuna.trial.TrialState
        if job.trial < 0 or job.trial >= len(self.study.trials):
            return
        if self.study.trials[job.trial].state != State.RUNNING:
            return
        result = job.result or {}
        value = (result.get("metrics") or {}).get(self.options.metric)
        if job.status == "succeeded" and result.get("stop_reason") == PRUNED_REASON:
            self.study.tell(job.trial, state=State.PRUNED)
            outcome = "pruned"
        elif job.status == "succeeded" and isinstance(value, int | float):
            self.study.tell(job.trial, float(value))
            outcome = f"{self.options.metric} {value:.5f}"
        else:
            self.study.tell(job.trial, state=State.FAIL)
            outcome = f"failed (job {job.status}, {self.options.metric}: {value})"
        self._log(f"trial {job.trial}: job {job.job_id} {outcome}")

    def _best_value(self) -> dict[str, float] | None:
        try:
            return {f"best/{self.options.metric}": float(self.study.best_value)}
        except ValueError:
            return None  # no trial completed yet

    def summary(self) -> dict[str, Any]:
        import optuna

        jobs = {job.trial: job for job in searches.trial_jobs(self.ctx.factory, self.ctx.job.id)}
        counts: dict[str, int] = {}
        for trial in self.study.trials:
            counts[trial.state.name.lower()] = counts.get(trial.state.name.lower(), 0) + 1
        summary: dict[str, Any] = {
            "study": self.study.study_name,
            "metric": self.options.metric,
            "trials": counts,
        }
        completed = self.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if completed:
            best = self.study.best_trial
            summary["best"] = {
                "trial": best.number,
                "value": best.value,
                "params": best.params,
                "job_id": jobs[best.number].job_id if best.number in jobs else None,
            }
        return summary

    def _log(self, line: str) -> None:
        with self.ctx.log_file.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def run_search(ctx: JobContext, options: AutomlJob) -> dict[str, Any]:
    """Run (or resume) the search; returns its summary with the best trial."""
    assert ctx.job.spec is not None, "the action checked that the job has a spec"
    base = ExperimentSpec.model_validate(ctx.job.spec)
    space = search_space(options, base, ctx.settings)
    storage = searches.study_storage(ctx.settings)
    settings = search_settings(options, base)
    study = open_study(searches.study_name(ctx.job.id), storage, settings)
    from maskops_worker.celery_app import app

    # Trials are sent by the rule the API sends every job by, with this worker's app.
    dispatcher = CeleryDispatcher(ctx.settings, app)
    return Search(ctx, options, base, space, study, dispatcher).run()


def trial_pruning_hook(ctx: JobContext, spec: ExperimentSpec, options: TrainJob) -> list[Any]:
    """For a trial of a search: the hook reporting its evaluations to the study's pruner
    (none for another train job, or a trial whose study already knows its outcome)."""
    import optuna

    job = ctx.job
    if options.trial is None or job.parent_action != JobAction.automl or job.parent_job_id is None:
        return []
    storage = searches.study_storage(ctx.settings)
    name = searches.study_name(job.parent_job_id)
    study = load_study(name, storage)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(name), options.trial
    )
    if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
        return []
    metric = str(study.user_attrs.get("metric", "mask_AP"))
    report = trial_reporter(optuna.trial.Trial(study, trial_id))
    return [PruningHook(metric, spec.num_steps_per_eval, report)]
