"""The options of each job action, as strict pydantic models.

One model per action, referenced from the catalogue (``JobAction.<action>.spec.options``):
the API validates a job's options with it at the door (422 naming the option) and the
worker reads them through the same model. A declared task's model is built from its
declaration (:mod:`maskops.tasks`, :func:`task_options_model`): its fields, help, bounds and
defaults are the declared options'; the worker turns them back into the task's options
dataclass (``maskops.options_schema.engine_values``). Extra keys and wrong types are
refused (``"gpu_index": "0"`` and ``true`` are not 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from maskops.export.options import opset_error
from maskops.options_schema import (
    DeclaredOption,
    TaskDeclaration,
    declared_options,
    engine_values,
)
from maskops.serving.publish_options import MODEL_NAME_REST_PATTERN
from maskops.shape_rules import batch_order_error
from maskops.tasks import AUTOML, EVALUATE, EXPORT, INFERENCE, PRUNE, PUBLISH, TRAIN
from maskops.training.train_options import TrainOptions as EngineTrainOptions
from maskops_core.paths import RELATIVE_PATH_PATTERN, relative_data_path

MODEL_NAME_PATTERN = MODEL_NAME_REST_PATTERN
"""A published model's name (the Triton ensemble users call), as the REST paths naming a
model and a publish job's ``name`` take it (``maskops.serving.publish_options``)."""


DataPath = Annotated[
    str,
    Field(min_length=1, max_length=1024, json_schema_extra={"pattern": RELATIVE_PATH_PATTERN}),
    AfterValidator(relative_data_path),
]
"""A file or folder under the server's data root."""


class ActionOptions(BaseModel):
    """Base of every action's options: strict, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def given(self, *, exclude: set[str] | None = None) -> dict[str, Any]:
        """The options the job set (the engine's defaults apply to the rest)."""
        return self.model_dump(exclude_unset=True, exclude=exclude)


class NoOptions(ActionOptions):
    """The action takes no options."""


def _rest_field(declared: DeclaredOption) -> tuple[Any, Any]:
    """(annotation, field) of a declared option at the REST door: its choices or type (a
    path is a :data:`DataPath`), its bounds and pattern, its help as the description, the
    other names it is accepted under; required where it has no default, optional (None)
    where its default is None."""
    kind: Any = declared.base_type
    spec = declared.spec
    if declared.choices:
        kind = Literal[declared.choices]
    elif kind is Path:
        kind = DataPath
    elif declared.is_list and kind is str:
        kind = Annotated[str, Field(min_length=1, max_length=200)]
    elif spec.max_length is not None:
        kind = Annotated[kind, Field(min_length=1, max_length=spec.max_length)]
    if spec.pattern is not None:
        kind = Annotated[kind, Field(pattern=spec.pattern)]
    default = declared.rest_default
    described: dict[str, Any] = {"description": spec.help}
    if spec.rest_aliases:
        assert declared.rest_name is not None  # only a REST option has REST names
        described["validation_alias"] = AliasChoices(declared.rest_name, *spec.rest_aliases)
    if declared.required:
        return kind, Field(**described)
    if declared.is_list:
        return list[kind], Field(
            default_factory=lambda: list(default), max_length=declared.spec.max_items, **described
        )
    bounded = kind
    if spec.ge is not None or spec.le is not None:
        bounded = Annotated[kind, Field(ge=spec.ge, le=spec.le)]
    if default is None:
        return bounded | None, Field(default=None, **described)
    return bounded, Field(default=default, **described)


def declared_field(options_class: type, rest_name: str) -> Any:
    """The pydantic field of the declared option of ``options_class`` whose REST name is
    ``rest_name`` (its REST default, bounds and help as the description), for a request
    body that gives the annotation itself (the REST dataset's conversion options)."""
    declared = next(o for o in declared_options(options_class) if o.rest_name == rest_name)
    default = declared.rest_default
    return Field(
        default=list(default) if isinstance(default, tuple) else default,
        description=declared.spec.help,
        ge=declared.spec.ge,
        le=declared.spec.le,
        max_length=declared.spec.max_items,
    )


ModelT = TypeVar("ModelT", bound=ActionOptions)


def task_options_model(
    task: TaskDeclaration, base: type[ModelT], **validators: Any
) -> type[ModelT]:
    """A job's options model of ``task``: ``base``'s fields (what the control plane adds)
    and each declared option that has a REST name, with ``validators``. It has the name of
    the task's options dataclass and no docstring (it would become the schema's
    description in the OpenAPI document)."""
    fields = {
        declared.rest_name: _rest_field(declared)
        for declared in declared_options(task.options)
        if declared.rest_name is not None
    }
    model: type[ModelT] = create_model(  # type: ignore[call-overload]
        task.options.__name__,
        __base__=base,
        __module__=__name__,
        __validators__=validators,
        **fields,
    )
    return model


class ModelSource(ActionOptions):
    """Which model a follow-up job works on: its parent's, or another file."""

    model_path: DataPath | None = Field(
        default=None, description="A checkpoint under the data root instead of the parent's."
    )
    checkpoint: Literal["best", "latest"] | None = Field(
        default=None,
        description="Of a parent train job: its best checkpoint (by the spec's "
        "best_checkpoint_metric) or its latest; default: the one it ended with.",
    )

    SOURCE_FIELDS: ClassVar[frozenset[str]] = frozenset({"model_path", "checkpoint"})
    """Read by the worker, not passed on to the engine."""


class TrainJob(ActionOptions):
    """A train job's options: the declared ones a job sets (the rendezvous is the workers',
    restarts the operator's ``MASKOPS_TRAIN_MAX_RESTARTS``), plus ``trial``, an AutoML
    search's."""

    trial: int | None = Field(
        default=None,
        ge=0,
        description="Set by an AutoML search on the train jobs it creates: the number of the "
        "study's trial the job runs (its parent_job_id is the search).",
    )

    def engine(self, *, rdzv_endpoint: str = "", max_restarts: int = 0) -> EngineTrainOptions:
        """The engine's options of this job (the worker adds the rendezvous it hosts or
        joins and the restarts the operator allows)."""
        return EngineTrainOptions(
            **engine_values(EngineTrainOptions, self.model_dump()),
            rdzv_endpoint=rdzv_endpoint,
            max_restarts=max_restarts,
        )


class InferenceJob(ModelSource):
    """An inference job's options: the declared ones and the images it runs on."""

    image_dir: DataPath | None = Field(
        default=None, description="Images under the data root (default: the dataset's val)."
    )


TrainOptions = task_options_model(TRAIN, TrainJob)
EvaluateOptions = task_options_model(EVALUATE, ModelSource)
PruneOptions = task_options_model(PRUNE, ModelSource)
InferenceOptions = task_options_model(INFERENCE, InferenceJob)


def _export_rules(options: Any) -> Any:
    """min <= opt <= max for a dynamic batch; a static one admits only its own size;
    DeepStream files only for the TAO layout (no DeepStream parser reads maskops')."""
    if options.gen_ds_config and options.output_layout == "maskops":
        raise ValueError("gen_ds_config needs the tao output_layout (or leave it out)")
    opset_problem = opset_error(options.opset, options.data_type)
    if opset_problem is not None:
        raise ValueError(f"opset {options.opset}: {opset_problem}")
    if options.static_batch_size is not None:
        for name in ("min_batch_size", "opt_batch_size"):
            if getattr(options, name) not in (None, options.static_batch_size):
                raise ValueError(f"{name} must equal static_batch_size or be left out")
        return options
    low = options.min_batch_size or 1
    tuned = options.opt_batch_size or options.max_batch_size
    error = batch_order_error(low, tuned, options.max_batch_size)
    if error is not None:
        raise ValueError(error)
    return options


# The export options a job may set (the output, calibration cache and engine paths are the
# job's).
ExportOptions = task_options_model(
    EXPORT, ModelSource, profile_in_order=model_validator(mode="after")(_export_rules)
)


PublishOptions = task_options_model(PUBLISH, ActionOptions)
"""A publish job's options: the declared ones with a REST name (``name``); where and how
Triton serves is the operator's (``maskops_core.settings``)."""


def _aliases(name: str, *tao: str) -> AliasChoices:
    """The option's name, then TAO API's names for it."""
    return AliasChoices(name, *tao)


class RangeOverride(ActionOptions):
    """One entry of TAO API's ``automl_range_override``."""

    parameter: str = Field(min_length=1, max_length=200)
    valid_min: float | None = None
    valid_max: float | None = None
    valid_options: list[bool | int | float | str] | None = Field(default=None, max_length=100)


SpaceEntry = dict[str, bool | int | float | str | list[bool | int | float | str]]


class AutomlJob(ActionOptions):
    """An AutoML search: the declared search settings (:mod:`maskops.automl.options`) and
    the search space; TAO API's field names (``automl_algorithm``, ...) are accepted too.
    The search space's fields are checked against the spec schema by the API (it knows the
    schema), each trial is a train job with these fields sampled."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=True, validate_by_alias=True
    )

    if TYPE_CHECKING:
        # The declared options are fields of the model task_options_model makes from this
        # base (:data:`AutomlOptions`); to the type checker they are its attributes.
        def __getattr__(self, name: str) -> Any: ...

    hyperparameters: dict[str, SpaceEntry] | list[str] | None = Field(
        default=None,
        max_length=100,
        validation_alias=_aliases("hyperparameters", "automl_hyperparameters"),
        description="Spec fields to search: {field: {min, max, log} | {choices}} or a list of "
        "fields (default ranges); none: learning rate, warm-up, weight decay, anchor scale, "
        "RPN/RoI batch sizes.",
    )
    add_hyperparameters: list[str] = Field(
        default_factory=list,
        max_length=100,
        validation_alias=_aliases("add_hyperparameters", "automl_add_hyperparameters"),
    )
    remove_hyperparameters: list[str] = Field(
        default_factory=list,
        max_length=100,
        validation_alias=_aliases("remove_hyperparameters", "automl_remove_hyperparameters"),
    )
    range_override: list[RangeOverride] = Field(
        default_factory=list,
        max_length=100,
        validation_alias=_aliases("range_override", "automl_range_override"),
    )

    @field_validator("algorithm", "sampler", mode="before", check_fields=False)
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    def search_space(self) -> dict[str, SpaceEntry] | list[str] | None:
        """The searched fields, as the engine's ``resolve_space`` takes them (with
        ``add_hyperparameters`` added); overrides and removals are separate."""
        base = self.hyperparameters
        if not self.add_hyperparameters:
            return base
        if isinstance(base, dict):
            added: dict[str, SpaceEntry] = {path: {} for path in self.add_hyperparameters}
            return {**added, **base}
        return [*(base or []), *self.add_hyperparameters]

    def range_overrides(self) -> dict[str, dict[str, object]]:
        """TAO's ``automl_range_override`` entries as ranges or choices."""
        overrides: dict[str, dict[str, object]] = {}
        for entry in self.range_override:
            if entry.valid_options is not None:
                overrides[entry.parameter] = {"choices": list(entry.valid_options)}
            else:
                overrides[entry.parameter] = {"min": entry.valid_min, "max": entry.valid_max}
        return overrides


AutomlOptions = task_options_model(AUTOML, AutomlJob)
"""An automl job's options: :class:`AutomlJob` with the declared search settings."""
