"""The ``train`` action (one rank here, or several under torchrun) and the extra nodes of a
multi-node train job (:func:`train_node`)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maskops.spec.models import ExperimentSpec
from maskops_core.options import TrainJob, TrainOptions
from maskops_worker.actions.common import job_options, job_spec
from maskops_worker.contract import JobCancelled, JobContext, JobRequeued

if TYPE_CHECKING:
    from maskops.training.launcher import RankPlan
    from maskops.training.train import TrainResult


def train(ctx: JobContext) -> dict[str, Any]:
    from maskops.training.errors import TrainingCancelled

    spec = job_spec(ctx)
    options = job_options(ctx, TrainOptions)
    # The same directory on every attempt: a re-dispatched or resumed job continues from
    # its last checkpoint there.
    results_dir = ctx.work_dir / "results"
    try:
        outcome = _train_ranks(ctx, spec, results_dir, options)
    except TrainingCancelled as exc:
        raise JobCancelled(_checkpoint_result(ctx, exc.step, exc.checkpoint)) from exc
    root = ctx.settings.data_root
    run = options.engine()
    ranks = run.gpus * run.nodes
    return {
        "step": outcome.step,
        "total_steps": outcome.total_steps,
        "results_dir": str(results_dir.relative_to(root)),
        "checkpoint": str(outcome.checkpoint.relative_to(root)) if outcome.checkpoint else None,
        "metrics": outcome.metrics,
        "stop_reason": outcome.stop_reason,
        "ranks": ranks,
        "effective_batch": ranks * spec.train_batch_size * spec.accumulate_grad_steps,
    }


def _train_ranks(
    ctx: JobContext, spec: ExperimentSpec, results_dir: Path, options: TrainJob
) -> TrainResult:
    """One rank in this process, reporting through a hook; several under torchrun as a
    child process (the launcher the CLI uses), reporting rank 0's status file."""
    from maskops.training.errors import RendezvousFailed
    from maskops.training.launcher import train_under_torchrun
    from maskops.training.train import logger as training_logger
    from maskops.training.train import run_training
    from maskops_worker.automl import trial_pruning_hook
    from maskops_worker.hooks import control_plane_hook, status_reporter

    if options.engine().in_process:
        with ctx.job_log.engine_lines(training_logger):
            return run_training(
                spec,
                results_dir,
                gpu_index=options.engine().gpu_index,
                extra_hooks=[
                    control_plane_hook(ctx, every_steps=spec.report_frequency),
                    *trial_pruning_hook(ctx, spec, options),
                ],
            )
    plan = _rank_plan(ctx, options, endpoint=_lead_nodes(ctx, options), leads=True)
    # torchrun's own lines (a rank failed, the group restarts) and the ranks' logs all go
    # to the job's log.
    with ctx.job_log.process_output() as log, ctx.job_log.engine_lines(training_logger):
        try:
            return train_under_torchrun(
                spec,
                results_dir,
                plan,
                output=log,
                should_stop=ctx.stop_event.is_set,
                on_status=status_reporter(ctx),
            )
        except RendezvousFailed as exc:
            raise JobRequeued(str(exc)) from exc


def _rank_plan(ctx: JobContext, options: TrainJob, *, endpoint: str, leads: bool) -> RankPlan:
    """The torchrun plan of this attempt: the same on every node of the job, but the
    leader's agent serves the rendezvous store (the workers may share a host name)."""
    from maskops.training.launcher import RankPlan

    run = options.engine(rdzv_endpoint=endpoint, max_restarts=ctx.settings.train_max_restarts)
    return RankPlan(
        nproc_per_node=run.gpus,
        nnodes=run.nodes,
        rdzv_endpoint=run.rdzv_endpoint,
        rdzv_id=f"maskops-job-{ctx.job.id}-attempt-{ctx.job.attempts}",
        hosts_rendezvous=leads if endpoint else None,
        max_restarts=run.max_restarts,
        join_timeout_s=ctx.settings.rendezvous_timeout_s,
        gpu_index=run.gpu_index,
    )


def _lead_nodes(ctx: JobContext, options: TrainJob) -> str:
    """For a multi-node job: host its rendezvous here (this worker claimed it) and send
    one node task per other node; returns the endpoint ("" for one node)."""
    nodes = options.engine().nodes
    if nodes == 1:
        return ""
    from maskops_core.actions import TRAIN_NODE_TASK, stack_kwargs
    from maskops_core.identity import database_identity
    from maskops_worker.celery_app import app

    with socket.socket() as probe:
        probe.bind(("", 0))
        endpoint = f"{socket.gethostname()}:{probe.getsockname()[1]}"
    for _ in range(nodes - 1):
        app.send_task(
            TRAIN_NODE_TASK,
            args=[ctx.job.id, ctx.job.attempts, endpoint],
            kwargs=stack_kwargs(ctx.settings.stack_id, database_identity(ctx.factory)),
        )
    wait = ctx.settings.rendezvous_timeout_s
    ctx.job_log.write(f"{nodes} nodes gather at {endpoint} (for up to {wait:g} s)")
    return endpoint


def train_node(ctx: JobContext, endpoint: str) -> None:
    """One more node of a multi-node train job: a torchrun agent joining the rendezvous
    the leading worker hosts. Rank 0 (wherever it lands) writes the shared results."""
    from maskops.training.launcher import train_under_torchrun

    options = job_options(ctx, TrainOptions)
    with ctx.job_log.process_output() as log:
        train_under_torchrun(
            job_spec(ctx),
            ctx.work_dir / "results",
            _rank_plan(ctx, options, endpoint=endpoint, leads=False),
            output=log,
        )


def _checkpoint_result(ctx: JobContext, step: int, checkpoint: Path | None) -> dict[str, Any]:
    root = ctx.settings.data_root
    return {
        "step": step,
        "checkpoint": str(checkpoint.relative_to(root)) if checkpoint else None,
    }
