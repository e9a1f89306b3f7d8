"""Request and response bodies of the REST API (pydantic v2), with Swagger examples."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    Strict,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from maskops.data.convert_options import ConvertOptions
from maskops_core import names, options
from maskops_core.actions import JobAction
from maskops_core.dataset_formats import MAX_LABEL_CHARS, DatasetFormat
from maskops_core.db.models import JobStatus
from maskops_core.paths import RELATIVE_PATH_PATTERN, relative_data_path

T = TypeVar("T")

MAX_ID = 2**31 - 1


def _printable(value: str) -> str:
    return names.check_name(value)


def _integral(value: object) -> object:
    # JSON Schema's "integer" includes 2.0 (a number without a fractional part).
    return int(value) if isinstance(value, float) and value.is_integer() else value


MAX_OPTIONS_BYTES = 64 * 1024
"""A job's options, serialized as JSON."""


def _bounded_options(value: dict[str, Any]) -> dict[str, Any]:
    # Stored with the job and returned in every listing: bounded like a column.
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_OPTIONS_BYTES:
        raise ValueError(f"at most {MAX_OPTIONS_BYTES} bytes as JSON ({size} given)")
    return value


# Request bodies take JSON's own types: "1" is not an id, nor true a count (pydantic's lax
# mode would coerce both).
Int = Annotated[int, BeforeValidator(_integral), Strict()]
"""A JSON integer, ``2.0`` included."""
Id = Annotated[int, Field(ge=1, le=MAX_ID), BeforeValidator(_integral), Strict()]
"""Database ids (Postgres ``integer``)."""
Name = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": names.NAME_PATTERN}),
    AfterValidator(_printable),
]
"""A resource's name: printable text (:mod:`maskops_core.names`)."""

TAO_SPEC_EXAMPLE = """\
seed: 123
use_amp: False
warmup_steps: 0
init_learning_rate: 0.005
learning_rate_steps: "[40]"
learning_rate_decay_levels: "[0.1]"
total_steps: 50
train_batch_size: 2
eval_batch_size: 2
num_steps_per_eval: 25
momentum: 0.9
l2_weight_decay: 0.0001
data_config {
  image_size: "(256, 256)"
  augment_input_data: True
  eval_samples: 8
  num_classes: 4
  n_workers: 1
  max_num_instances: 50
}
maskrcnn_config {
  arch: "resnet"
  nlayers: 18
  gt_mask_size: 56
  mrcnn_resolution: 28
  min_level: 2
  max_level: 6
  num_scales: 1
  aspect_ratios: "[(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)]"
  anchor_scale: 8.0
  test_detections_per_image: 50
}
"""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def _relative_path(value: str, field: str) -> str:
    """``value`` checked by :func:`relative_data_path`, written with ``/`` (``a\\b`` ->
    ``a/b``)."""
    try:
        relative_data_path(value)
    except ValueError as exc:
        raise ValueError(f"{field} {exc}") from None
    return str(PurePosixPath(value.replace("\\", "/")))


DataPath = Annotated[str, Field(json_schema_extra={"pattern": RELATIVE_PATH_PATTERN})]


class DatasetSplit(_Body):
    image_dir: DataPath = Field(description="Image directory, relative to the server's data root.")
    annotation_file: DataPath = Field(
        description="COCO JSON, relative to the server's data root; for another `format`, "
        "its annotation file or folder."
    )

    @field_validator("image_dir", "annotation_file")
    @classmethod
    def _relative(cls, value: str, info: Any) -> str:
        return _relative_path(value, info.field_name)


class DatasetCreate(_Body):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "shapes",
                    "train": {
                        "image_dir": "demo/images/train",
                        "annotation_file": "demo/annotations/train.json",
                    },
                    "val": {
                        "image_dir": "demo/images/val",
                        "annotation_file": "demo/annotations/val.json",
                    },
                    "num_shards": 4,
                }
            ]
        },
    )

    name: Name
    train: DatasetSplit
    val: DatasetSplit | None = None
    # The conversion's options, as declared (maskops.data.convert_options).
    num_shards: Int = options.declared_field(ConvertOptions, "num_shards")
    include_masks: Annotated[bool, Strict()] = options.declared_field(
        ConvertOptions, "include_masks"
    )
    format: DatasetFormat = options.declared_field(ConvertOptions, "format")
    labels: list[Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]] | None = (
        options.declared_field(ConvertOptions, "labels")
    )

    @field_validator("labels")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("labels must be distinct")
        return value


class DatasetOut(_Out):
    id: int
    name: str
    splits: dict[str, DatasetSplit]
    status: str = Field(description="Status of the dataset_convert job.")
    convert_job_id: int | None
    shards_dir: str | None
    counts: dict[str, Any] | None
    label_map: list[dict[str, Any]] | None
    warnings: list[Any] | None
    created_at: datetime
    format: str = "coco"
    labels: list[str] | None = None


_SPEC_GIVEN: dict[str, Any] = {"required": ["spec"], "properties": {"spec": {"type": "object"}}}
_SPEC_TEXT_GIVEN: dict[str, Any] = {
    "required": ["spec_text"],
    "properties": {"spec_text": {"type": "string"}},
}
"""JSON Schema for "``spec`` (``spec_text``) is there and not null"."""


class ExperimentCreate(_Body):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [_SPEC_GIVEN, _SPEC_TEXT_GIVEN],
            "examples": [
                {"name": "shapes-r18", "dataset_id": 1, "spec_text": TAO_SPEC_EXAMPLE},
                {
                    "name": "shapes-r18-json",
                    "dataset_id": 1,
                    "spec": {
                        "total_steps": 50,
                        "train_batch_size": 2,
                        "init_learning_rate": 0.005,
                        "data_config": {"image_size": [256, 256], "num_classes": 4},
                        "maskrcnn_config": {"nlayers": 18},
                    },
                },
            ],
        },
    )

    name: Name
    dataset_id: Id | None = None
    spec: dict[str, Any] | None = Field(default=None, description="The spec as JSON.")
    spec_text: str | None = Field(
        default=None, description="The spec in TAO's protobuf text format."
    )

    @model_validator(mode="after")
    def _one_spec(self) -> ExperimentCreate:
        if (self.spec is None) == (self.spec_text is None):
            raise ValueError("give exactly one of spec (JSON) or spec_text (TAO text)")
        return self


class ExperimentUpdate(_Body):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {"allOf": [_SPEC_GIVEN, _SPEC_TEXT_GIVEN]},
            "examples": [{"spec_text": TAO_SPEC_EXAMPLE}],
        },
    )

    name: Name | None = None
    spec: dict[str, Any] | None = None
    spec_text: str | None = None

    @model_validator(mode="after")
    def _at_most_one_spec(self) -> ExperimentUpdate:
        if self.spec is not None and self.spec_text is not None:
            raise ValueError("give at most one of spec (JSON) or spec_text (TAO text)")
        return self


class ExperimentOut(_Out):
    id: int
    name: str
    dataset_id: int | None
    version: int = Field(description="The version whose spec this is.")
    latest_version: int = Field(
        description="The newest version a user made (creating the experiment or updating "
        "its spec): what a job or a read naming no version gets. An AutoML search's trial "
        "versions never are."
    )
    search_job_id: int | None = Field(
        description="The AutoML search (its job) whose trial made this version; null for a "
        "version a user made."
    )
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class JobCreate(_Body):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"action": "train", "experiment_id": 1},
                {"action": "evaluate", "experiment_id": 1, "parent_job_id": 2},
                {"action": "dataset_convert", "dataset_id": 1},
            ]
        },
    )

    action: JobAction
    experiment_id: Id | None = None
    experiment_version: Id | None = Field(
        default=None,
        description="Defaults to the experiment's latest_version (the newest version a user "
        "made, never an AutoML trial's); with parent_job_id and no experiment_id, the "
        "parent's.",
    )
    dataset_id: Id | None = Field(default=None, description="Defaults to the experiment's dataset.")
    parent_job_id: Id | None = Field(
        default=None,
        description="The job whose model this one uses (evaluate/prune/export).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description=f"The action's options; at most {MAX_OPTIONS_BYTES} bytes as JSON.",
    )

    _bounded = field_validator("options")(_bounded_options)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The body as the server reads it: one variant per action of the catalogue (a
        union keyed on ``action``), each with what the action needs and its options'
        model. The service (maskops_api.services.jobs) checks the same catalogue, so a
        body valid here is refused only for the state of what it names (404, 409)."""
        reference = handler(core_schema)
        schema = handler.resolve_ref_schema(reference)
        schema["oneOf"] = [_job_variant(action, handler) for action in JobAction]
        return reference


def _job_variant(action: JobAction, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    spec = action.spec
    needed = ["parent_job_id"] if spec.parents else []
    if spec.needs_experiment and not spec.parents:  # a parent brings its experiment
        needed.append("experiment_id")
    if spec.needs_dataset:
        needed.append("dataset_id")
    if any(field.is_required() for field in spec.options.model_fields.values()):
        needed.append("options")
    properties: dict[str, Any] = {
        "action": {"const": action.value},
        "options": handler(spec.options.__pydantic_core_schema__),
    }
    for name in needed:
        if name != "options":  # given, and not null
            properties[name] = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
    return {"title": action.value, "properties": properties, "required": ["action", *needed]}


class Progress(BaseModel):
    step: int | None
    total: int | None
    fraction: float | None
    eta_seconds: float | None


class JobOut(_Out):
    id: int
    action: JobAction
    status: JobStatus
    experiment_id: int | None
    experiment_version: int | None
    dataset_id: int | None
    parent_job_id: int | None
    options: dict[str, Any]
    queue: str
    attempts: int
    progress: Progress
    latest_metrics: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None
    worker_id: str | None
    heartbeat_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class MetricPoint(BaseModel):
    step: int
    time: datetime
    values: dict[str, float]


class Artifact(BaseModel):
    path: str
    size: int


class ModelOut(_Out):
    name: str
    version: int
    job_id: int
    published: bool
    created_at: datetime
    replicas: dict[str, str] | None = Field(
        default=None,
        description="GET /models/{name} only: per Triton replica (host:port), this "
        "version's state there (READY, UNAVAILABLE, LOADING, not loaded) or why the "
        "replica could not be asked.",
    )
    network: dict[str, str] | None = Field(
        default=None,
        description="GET /models/{name} only: where this version's network runs, from its "
        "Triton config: net_backend (python, onnxruntime, tensorrt, torch), device (cpu, "
        "gpu), precision (the export's data type; torch: fp32, bf16, fp16 or auto). None "
        "when no replica has it loaded, or for versions published before configs said.",
    )
    instances: dict[str, int] | None = Field(
        default=None,
        description="GET /models/{name} only: how many instances of this version's "
        "preprocess, network and postprocess models run on a replica (Triton's "
        "instance_group; a network on GPUs counts once per GPU). None when no replica "
        "has it loaded.",
    )


class CocoResult(BaseModel):
    image_id: int = Field(description="Position of the image in the request (0-based).")
    category_id: int
    category_name: str | None = None
    bbox: list[float] = Field(description="[x, y, width, height] in original pixels.")
    score: float
    segmentation: dict[str, Any] | list[list[float]] | None = Field(
        default=None,
        description='COCO RLE {"size": [h, w], "counts": str}, or with mask_format=polygon '
        "COCO polygons [[x1, y1, x2, y2, ...], ...].",
    )


# A published model's name: defined once, with the publish job's options.
MODEL_NAME_PATTERN = options.MODEL_NAME_PATTERN


class PublishRequest(_Body):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"job_id": 5}]})

    job_id: Int = Field(ge=1, le=MAX_ID, description="A succeeded export job.")


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    checks: dict[str, str] = Field(default_factory=dict)
    triton_replicas: dict[str, str] | None = Field(
        default=None,
        description="Per Triton replica (host:port), ok or why it is not ready; /readyz "
        "answers 200 while one replica of several is.",
    )


class ErrorOut(BaseModel):
    detail: str


class AutomlCreate(_Body):
    """An AutoML search of an experiment: its options are the ``automl`` job's (TAO API's
    automl_* names are accepted too)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "experiment_id": 1,
                    "options": {
                        "algorithm": "asha",
                        "max_recommendations": 8,
                        "max_concurrent": 2,
                        "metric": "mask_AP",
                        "hyperparameters": {
                            "init_learning_rate": {"min": 0.001, "max": 0.05, "log": True},
                            "maskrcnn_config.anchor_scale": {"choices": [4.0, 8.0]},
                        },
                    },
                },
                {
                    "experiment_id": 1,
                    "options": {
                        "automl_algorithm": "bayesian",
                        "automl_max_recommendations": 10,
                        "automl_hyperparameters": ["init_learning_rate", "l2_weight_decay"],
                    },
                },
            ]
        },
    )

    experiment_id: Id
    experiment_version: Id | None = Field(
        default=None,
        description="Defaults to the experiment's latest_version (the newest version a user "
        "made, never an earlier search's trial version).",
    )
    dataset_id: Id | None = Field(default=None, description="Defaults to the experiment's dataset.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The search (see the automl job's options)."
    )

    _bounded = field_validator("options")(_bounded_options)


class TrialOut(BaseModel):
    number: int
    state: str
    """``running``, ``complete``, ``pruned``, ``fail``, or ``interrupted``: running when
    its search was cancelled or failed, resumed with the search."""
    params: dict[str, Any]
    value: float | None
    intermediate: dict[str, float]
    """The metric at each in-training evaluation (step -> value)."""
    job_id: int | None
    job_status: JobStatus | None
    experiment_version: int | None


class AutomlOut(BaseModel):
    job: JobOut
    algorithm: str | None
    sampler: str | None = Field(description="gp, tpe or random (null before the search starts).")
    pruner: str | None
    metric: str | None
    direction: str | None
    trials: list[TrialOut]
    best: TrialOut | None
    best_spec_text: str | None = Field(description="The best trial's spec in TAO's text format.")
    best_checkpoint: str | None = Field(
        description="The best trial's checkpoint (relative to the data root); evaluate, prune "
        "or export it with parent_job_id = best.job_id."
    )
