"""One function per job action: each turns a job into a call of the engine function that the
CLI uses too, and returns the job's result (JSON-able). No engine logic lives here.

Engine modules are imported inside the actions: a CPU worker converting datasets never
imports the model code.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from maskops.options_schema import engine_values
from maskops.path_rules import PathEscape, confine
from maskops.spec.models import ExperimentSpec
from maskops_core import job_state
from maskops_core.options import (
    ActionOptions,
    AutomlOptions,
    EvaluateOptions,
    ExportOptions,
    InferenceOptions,
    ModelSource,
    PruneOptions,
    PublishOptions,
    TrainJob,
    TrainOptions,
)
from maskops_core.settings import ReplicaLookupError, Settings
from maskops_worker.contract import (
    Action,
    JobCancelled,
    JobContext,
    JobInputError,
    JobRequeued,
)

if TYPE_CHECKING:
    from maskops.evaluation.inference_options import InferenceOptions as EngineInferenceOptions
    from maskops.training.launcher import RankPlan
    from maskops.training.train import TrainResult

MAX_LISTED_WARNINGS = 100
"""Findings listed on the dataset per split; the full list stays in the warnings file."""

OptionsT = TypeVar("OptionsT", bound=ActionOptions)


def job_options(ctx: JobContext, model: type[OptionsT]) -> OptionsT:
    """The job's options read through the model the API validated them with (the
    catalogue's ``ActionSpec.options``); a job stored before that check fails here."""
    try:
        return model.model_validate(ctx.job.options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("options", *first["loc"]))
        raise JobInputError(f"{where}: {first['msg']}") from None


def _split_coco(root: Path, shards_dir: str | None, splits: dict[str, Any]) -> Path:
    """The val split's COCO file: as registered, or converted from its format."""
    from maskops.data.convert_options import DEFAULT_FORMAT
    from maskops.data.formats import coco_path

    val = splits["val"]
    if val.get("format", DEFAULT_FORMAT) != DEFAULT_FORMAT and shards_dir:
        return coco_path(root / shards_dir, "val")
    return root / val["annotation_file"]


def dataset_convert(ctx: JobContext) -> dict[str, Any]:
    from maskops.data.convert_options import DEFAULT_FORMAT, ConvertOptions
    from maskops.data.formats import coco_path, convert_labelled_dataset

    job = ctx.job
    if job.dataset_id is None or not job.dataset_splits:
        raise JobInputError("dataset_convert needs a dataset_id")
    root = ctx.settings.data_root
    out_dir = root / "datasets" / str(job.dataset_id) / "shards"
    counts: dict[str, Any] = {}
    warnings: list[Any] = []
    label_map: list[Any] = []
    splits = list(job.dataset_splits.items())
    for index, (split, paths) in enumerate(splits):
        if ctx.cancel_requested:
            raise JobCancelled()
        format_name = paths.get("format", DEFAULT_FORMAT)
        labels = paths.get("labels")
        options = ConvertOptions(
            format_name=format_name,
            labels=tuple(labels) if labels is not None else None,
            tag=split,
            num_shards=job.dataset_num_shards,
            include_masks=job.dataset_include_masks,
            # No process pool: forking a process that runs a heartbeat thread can copy a held
            # lock into the children and hang them. CPU workers scale by Celery concurrency.
            workers=1,
        )
        # The job's last line says what it was doing should its process die mid-conversion.
        ctx.job_log.write(
            f"converting {split}: {format_name} annotations {paths['annotation_file']}, "
            f"images {paths['image_dir']}"
        )
        result = convert_labelled_dataset(
            ctx.input_path(paths["image_dir"], f"the {split} images"),
            ctx.input_path(paths["annotation_file"], f"the {split} annotations"),
            out_dir,
            options,
            progress=_split_progress(ctx, index, len(splits)),
        )
        _append(ctx, result.summary())
        counts[split] = {
            "images": result.num_images,
            "skipped_images": result.num_skipped_images,
            "annotations": result.num_annotations,
            "crowd": result.num_crowd,
            "dropped_annotations": result.num_dropped_annotations,
            "shards": len(result.shards),
            "per_category": {str(k): v for k, v in result.category_counts.items()},
        }
        if format_name != DEFAULT_FORMAT:
            counts[split]["coco_file"] = str(coco_path(out_dir, split).relative_to(root))
        label_map = label_map or result.label_map.to_json()
        findings = json.loads(result.warnings_path.read_text())
        warnings.append(
            {
                "split": split,
                "counts": result.warning_counts,
                "file": str(result.warnings_path.relative_to(root)),
                "images": dict(list(findings.items())[:MAX_LISTED_WARNINGS]),
            }
        )
    relative_out = str(out_dir.relative_to(root))
    job_state.record_dataset(
        ctx.factory,
        job.dataset_id,
        shards_dir=relative_out,
        counts=counts,
        label_map=label_map,
        warnings=warnings,
    )
    return {"shards_dir": relative_out, "counts": {k: v["images"] for k, v in counts.items()}}


def _split_progress(ctx: JobContext, index: int, num_splits: int) -> Callable[[int, int], None]:
    """Progress of split ``index`` as a share of the whole job, in thousandths."""

    def report(done: int, total: int) -> None:
        ctx.report(index * 1000 + int(1000 * done / max(total, 1)), 1000 * num_splits)

    return report


def _append(ctx: JobContext, text: str) -> None:
    ctx.job_log.write(text)


def job_spec(ctx: JobContext, *, need: str = "training_file_pattern") -> ExperimentSpec:
    """The experiment's spec with its data paths filled from the job's converted dataset.

    Paths the spec sets itself win; every relative path field (data, ``checkpoint``,
    ``pruned_model_path``) resolves against the data root, as REST clients write them.
    """
    job = ctx.job
    if job.spec is None:
        raise JobInputError(f"job {job.id} ({job.action}) needs an experiment_id")
    root = ctx.settings.data_root
    spec = ExperimentSpec.model_validate(job.spec).resolve_paths(root)
    data = spec.data_config
    if job.dataset_shards_dir:
        shards = root / job.dataset_shards_dir
        if not data.training_file_pattern:
            data.training_file_pattern = str(shards / "train-*")
        if not data.validation_file_pattern and "val" in (job.dataset_splits or {}):
            data.validation_file_pattern = str(shards / "val-*")
    if not data.val_json_file and job.dataset_splits and "val" in job.dataset_splits:
        data.val_json_file = str(_split_coco(root, job.dataset_shards_dir, job.dataset_splits))
    if need and not getattr(data, need):
        raise JobInputError(f"the experiment has no {need} and its dataset provides none")
    return confine_trackers(spec, ctx.work_dir, allowed=ctx.settings.trackers)


def confine_trackers(
    spec: ExperimentSpec, job_dir: Path, *, allowed: Sequence[str]
) -> ExperimentSpec:
    """The spec with its trackers' destinations the operator's: a tracker not in
    ``allowed`` (``MASKOPS_TRACKERS``) fails the job; ``mlflow_config.tracking_uri`` is
    dropped (this worker's ``MLFLOW_TRACKING_URI``, else ``RESULTS_DIR/mlruns``) and W&B
    writes under ``<job>/wandb``. The API refuses both fields at the door; this holds for
    specs stored before it did, too."""
    for block in spec.enabled_trackers:
        if block.removesuffix("_config") not in allowed:
            raise JobInputError(
                f"{block}: this server does not allow that tracker (MASKOPS_TRACKERS)"
            )
    update: dict[str, Any] = {}
    if spec.mlflow_config is not None:
        update["mlflow_config"] = spec.mlflow_config.model_copy(update={"tracking_uri": ""})
    if spec.wandb_config is not None:
        wandb_dir = job_dir / "wandb"
        if spec.wandb_config.active:
            wandb_dir.mkdir(parents=True, exist_ok=True)  # W&B falls back to /tmp without it
        update["wandb_config"] = spec.wandb_config.model_copy(update={"wandb_dir": str(wandb_dir)})
    return spec.model_copy(update=update)


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
    _append(ctx, f"{nodes} nodes gather at {endpoint} (for up to {wait:g} s)")
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


def parent_model(ctx: JobContext, source: ModelSource) -> Path:
    """The model file a follow-up job (evaluate, prune, export, inference) works on."""
    job = ctx.job
    if source.model_path is not None:
        return ctx.input_path(source.model_path, "model_path")
    result = job.parent_result or {}
    if source.checkpoint is not None:
        return _chosen_checkpoint(ctx, result, source.checkpoint)
    for key in ("checkpoint", "model", "onnx"):
        if result.get(key):
            what = f"the {key} of job {job.parent_job_id} ({job.parent_action})"
            return ctx.input_path(str(result[key]), what)
    raise JobInputError(
        f"job {job.id} ({job.action}) needs parent_job_id of a succeeded train/prune job"
    )


def _chosen_checkpoint(ctx: JobContext, result: dict[str, Any], choice: str) -> Path:
    """The best or latest checkpoint of the parent training's results directory."""
    from maskops.checkpoints.run_directory import resolve_model_path

    job = ctx.job
    if job.parent_action != "train" or not result.get("results_dir"):
        raise JobInputError(f"options.checkpoint needs a parent train job (job {job.id})")
    results = ctx.input_path(str(result["results_dir"]), f"the results of job {job.parent_job_id}")
    try:
        return resolve_model_path(results / choice)
    except FileNotFoundError:
        kept = "no best checkpoint (it evaluates nothing)" if choice == "best" else "no checkpoint"
        raise JobInputError(f"job {job.parent_job_id} kept {kept}") from None


def _relative(ctx: JobContext, path: Path) -> str:
    return str(path.relative_to(ctx.settings.data_root))


def _logger(ctx: JobContext) -> Callable[[str], None]:
    return lambda line: _append(ctx, line)


def evaluate(ctx: JobContext) -> dict[str, Any]:
    from maskops.evaluation.options import EvaluateOptions as EngineEvaluateOptions
    from maskops.evaluation.runner import run_evaluation

    spec = job_spec(ctx, need="validation_file_pattern")
    options = job_options(ctx, EvaluateOptions)
    model = parent_model(ctx, options)
    report = ctx.work_dir / "metrics.json"
    metrics = run_evaluation(
        spec,
        model,
        EngineEvaluateOptions(**engine_values(EngineEvaluateOptions, options.model_dump())),
        out_json=report,
        progress=False,
        log=_logger(ctx),
    )
    ctx.report(1, 1, metrics)
    return {"metrics": metrics, "model": _relative(ctx, model), "report": _relative(ctx, report)}


def prune(ctx: JobContext) -> dict[str, Any]:
    from maskops.prune.options import PruneOptions as EnginePruneOptions
    from maskops.prune.run import run_prune

    options = job_options(ctx, PruneOptions)
    out_dir = ctx.work_dir / "pruned"
    engine_options = EnginePruneOptions(**engine_values(EnginePruneOptions, options.model_dump()))
    report = run_prune(parent_model(ctx, options), out_dir, engine_options)
    _append(ctx, f"params {report.params_before} -> {report.params_after}")
    ctx.report(1, 1, {"params_ratio": report.params_ratio})
    model = Path(report.output_model) if report.output_model else out_dir / "model.pth"
    return {
        "model": _relative(ctx, model if model.is_absolute() else out_dir / model),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "macs_before": report.macs_before,
        "macs_after": report.macs_after,
    }


def inference(ctx: JobContext) -> dict[str, Any]:
    from maskops.evaluation.inference import run_inference
    from maskops.evaluation.inference_options import InferenceOptions as EngineInferenceOptions

    spec = job_spec(ctx, need="")
    options = job_options(ctx, InferenceOptions)
    engine_options = EngineInferenceOptions(
        **engine_values(EngineInferenceOptions, options.model_dump())
    )
    if options.image_dir is not None:
        image_dir = _inside_data_root(ctx, options.image_dir)
    elif ctx.job.dataset_splits and "val" in ctx.job.dataset_splits:
        image_dir = ctx.data_path(ctx.job.dataset_splits["val"]["image_dir"])
    else:
        raise JobInputError("inference needs options.image_dir (relative to the data root)")
    out_images, labels = ctx.work_dir / "images", ctx.work_dir / "labels"
    summary = run_inference(
        spec,
        parent_model(ctx, options),
        image_dir,
        out_images,
        engine_options,
        label_dir=labels,
        progress=False,
        log=_logger(ctx),
        warn=_logger(ctx),
    )
    ctx.report(summary.images, summary.images)
    result: dict[str, Any] = {
        "images": summary.images,
        "detections": summary.detections,
        "skipped": [f"{p.name}: {why}" for p, why in summary.skipped],
        "annotated_images": _relative(ctx, out_images),
        "labels": _relative(ctx, labels),
    }
    if engine_options.exports and summary.images:
        result["exports"] = _export_predictions(ctx, engine_options, labels)
    return result


def _export_predictions(
    ctx: JobContext, options: EngineInferenceOptions, labels: Path
) -> list[str]:
    """The predictions as the labelling tools' files (``options.exports``), under exports/."""
    from maskops.data.formats.predictions import export_predictions

    parent = ctx.job.parent_job_id
    version = options.model_version or (f"job-{parent}" if parent else "maskops")
    written = export_predictions(
        labels,
        ctx.work_dir / "exports",
        list(options.exports),
        tolerance=options.polygon_tolerance,
        model_version=version,
    )
    return [_relative(ctx, path) for path in written]


def export(ctx: JobContext) -> dict[str, Any]:
    from maskops.export import export_onnx
    from maskops.export.options import ExportOptions as EngineExportOptions
    from maskops.export.options import export_file_name

    options = job_options(ctx, ExportOptions)
    values = engine_values(EngineExportOptions, options.model_dump())
    if values.get("cal_image_dir") is not None:
        values["cal_image_dir"] = _inside_data_root(ctx, values["cal_image_dir"])
    engine_options = EngineExportOptions(**values)
    data_type = engine_options.data_type
    spec = job_spec(ctx, need="")
    out_dir = ctx.work_dir / "export"
    out_dir.mkdir(parents=True, exist_ok=True)
    if data_type == "int8":
        engine_options = replace(engine_options, cal_cache_file=out_dir / "cal.bin")
    source = parent_model(ctx, options)
    result = export_onnx(
        source,
        spec,
        out_dir / export_file_name(source, data_type),
        engine_options,
        log=_logger(ctx),
    )
    ctx.report(1, 1, {f"{data_type}/{k}": v for k, v in result.metrics.get(data_type, {}).items()})
    return {
        "onnx": _relative(ctx, result.onnx_path),
        # What the torch net backend serves when this export is published.
        "source_checkpoint": _relative(ctx, source),
        "data_type": result.data_type,
        "report": _relative(ctx, result.report_path),
        "mask_ap_drop": result.mask_ap_drop,
        "engine_note": result.engine_note,
    }


def _inside_data_root(ctx: JobContext, relative: str) -> Path:
    try:
        path = confine(ctx.settings.data_root, relative)
    except (PathEscape, OSError, RuntimeError):  # leaves the data root, a link loop
        path = None
    if path is None or not path.is_dir():
        raise JobInputError(f"image_dir {relative!r} is not a directory under the data root")
    return path


def publish(ctx: JobContext) -> dict[str, Any]:
    """Write the parent export into the Triton model repository and roll it out on every
    Triton replica.

    The new version is listed only once every replica serves it (or no Triton is
    configured): when one cannot load it, the publish is undone, the version before it
    serves again on every replica, and the job fails saying why, replica by replica.
    """
    from maskops.serving import PublishError
    from maskops.serving.protocol import ImageLimits
    from maskops.serving.rollout import RolloutFailed, publish_and_roll_out

    job, settings = ctx.job, ctx.settings
    name = job_options(ctx, PublishOptions).name
    source = _publish_source(ctx)
    replicas = _replicas(ctx)
    try:
        version, rollout = publish_and_roll_out(
            source,
            settings.model_repository,
            name,
            replicas,
            log=lambda line: _append(ctx, line),
            **_network_options(ctx),
            # The API's limits, so that Triton called directly refuses what /infer does.
            image_limits=ImageLimits(**settings.infer_image_limits),
        )
    except PublishError as exc:
        raise JobInputError(f"publish {name!r}: {exc}") from None
    except RolloutFailed as failed:
        raise JobInputError(str(failed)) from None
    note = "" if replicas else "no Triton configured; the version is in the repository"
    assert job.parent_job_id is not None  # _publish_source checked
    job_state.record_published_model(
        ctx.factory, name=name, version=version, export_job_id=job.parent_job_id
    )
    ctx.report(1, 1)
    states = rollout.states() if rollout else {}
    served = bool(replicas)
    return {"name": name, "version": version, "served": served, "note": note, "replicas": states}


def _publish_source(ctx: JobContext) -> Path:
    """What the network serves: the parent export's ONNX; for the torch net backend a
    checkpoint: the parent train or prune job's, or the one the parent export was made
    from."""
    job = ctx.job
    result, parent = job.parent_result or {}, f"{job.parent_action} job {job.parent_job_id}"
    if job.parent_job_id is None or job.parent_action not in ("export", "train", "prune"):
        raise JobInputError("publish needs parent_job_id of a succeeded export, train or prune job")
    torch = _net_backend(ctx.settings) == "torch"
    if not torch and job.parent_action != "export":
        raise JobInputError(f"{parent}: its checkpoint is served by the torch net backend only")
    if not torch:
        return ctx.input_path(str(result.get("onnx") or ""), f"the ONNX of {parent}")
    key = "source_checkpoint" if job.parent_action == "export" else "checkpoint"
    return ctx.input_path(str(result.get(key) or ""), f"the checkpoint of {parent}")


def _net_backend(settings: Settings) -> str:
    """The net backend publishes get (``auto``: the placement's default)."""
    from maskops.serving.placement import Placement

    if settings.triton_net_backend != "auto":
        return settings.triton_net_backend
    return Placement(settings.triton_device).default_net_backend()


def _network_options(ctx: JobContext) -> dict[str, Any]:
    """The publish arguments of the operator's Triton settings (where the network runs,
    on which backend, the TensorRT an engine must match)."""
    from maskops.serving.placement import ENGINE_CACHE_ROOT, Placement

    settings = ctx.settings
    device = settings.triton_device
    backend = settings.triton_net_backend
    # The tensorrt backend's engine is <onnx stem>.engine next to the export's ONNX
    # (`maskops gen_trt_engine -m ONNX -r ITS_FOLDER` on a host with Triton's TensorRT).
    return {
        "placement": Placement(device, tuple(settings.triton_gpus)),
        "net_backend": None if backend == "auto" else backend,
        "triton_tensorrt_version": settings.triton_tensorrt_version or None,
        "engine_cache_root": settings.triton_engine_cache or ENGINE_CACHE_ROOT,
        "precision": settings.triton_precision,
    }


def _replicas(ctx: JobContext) -> list[str]:
    """The Triton replicas to publish to, looked up now; none when no Triton is set."""
    try:
        replicas = ctx.settings.triton_replicas()
    except ReplicaLookupError as exc:
        raise JobInputError(f"cannot find the Triton replicas: {exc}") from None
    if ctx.settings.has_triton and not replicas:
        raise JobInputError("MASKOPS_TRITON_DNS resolves to no Triton replica")
    return replicas


def automl(ctx: JobContext) -> dict[str, Any]:
    """An AutoML search's controller (:mod:`maskops_worker.automl`): runs until each of
    its trials (train jobs) has ended; returns the best."""
    from maskops_worker.automl import run_search

    options = job_options(ctx, AutomlOptions)
    job_spec(ctx)  # the experiment must train: data paths, a dataset (as its trials need)
    return run_search(ctx, options)


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
