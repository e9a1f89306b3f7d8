"""What the job actions share: a job's options read through its catalogue model (and, for
a declared task, turned into the engine's options dataclass), its experiment's spec with
the dataset's paths filled in, the model a follow-up job works on, and paths under the
data root."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from maskops.options_schema import TaskDeclaration, engine_values
from maskops.path_rules import PathEscape, confine
from maskops.spec.models import ExperimentSpec
from maskops_core.actions import JobAction
from maskops_core.options import ActionOptions, ModelSource
from maskops_worker.contract import JobContext, JobInputError

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


def declared_job_options(ctx: JobContext, task: TaskDeclaration) -> tuple[Any, Any]:
    """(the job's options as its catalogue model reads them, the engine's options
    dataclass of ``task`` they ask for): one conversion for every declared task's job."""
    options = job_options(ctx, JobAction.named(task.name).spec.options)
    return options, task.options(**engine_values(task.options, options.model_dump()))


def split_coco(root: Path, shards_dir: str | None, splits: dict[str, Any]) -> Path:
    """The val split's COCO file: as registered, or converted from its format."""
    from maskops.data.convert_options import DEFAULT_FORMAT
    from maskops.data.formats import coco_path

    val = splits["val"]
    if val.get("format", DEFAULT_FORMAT) != DEFAULT_FORMAT and shards_dir:
        return coco_path(root / shards_dir, "val")
    return root / val["annotation_file"]


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
        data.val_json_file = str(split_coco(root, job.dataset_shards_dir, job.dataset_splits))
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


def relative(ctx: JobContext, path: Path) -> str:
    """``path`` relative to the data root (how results name files)."""
    return str(path.relative_to(ctx.settings.data_root))


def job_logger(ctx: JobContext) -> Callable[[str], None]:
    """The engine's ``log`` callback: each line to the job's log."""
    return ctx.job_log.write


def inside_data_root(ctx: JobContext, relative_dir: str) -> Path:
    """The image folder ``relative_dir`` names under the data root (else the job fails)."""
    try:
        path = confine(ctx.settings.data_root, relative_dir)
    except (PathEscape, OSError, RuntimeError):  # leaves the data root, a link loop
        path = None
    if path is None or not path.is_dir():
        raise JobInputError(f"image_dir {relative_dir!r} is not a directory under the data root")
    return path
