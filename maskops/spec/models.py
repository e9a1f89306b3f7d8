"""Typed experiment spec: the JSON form of a TAO ``mask_rcnn`` experiment spec.

This is the one config object of maskops. The text form (protobuf text format, exactly as
TAO writes it) is parsed in :mod:`maskops.spec.text`; both forms end up here, and every check
lives here so that text and JSON specs are validated alike. String-valued lists of the text
form ("(832, 1344)", "[(1.0, 1.0), (1.4, 0.7)]") are typed values here; the JSON form accepts
either the typed value or TAO's string.

Defaults are TAO's published sample spec and field table. Fields
marked "maskops extension" do not exist in TAO; a TAO spec never needs them.

``total_steps`` and ``num_epochs`` are both kept as written (so text -> model -> text is
lossless); :attr:`ExperimentSpec.resolved_total_steps` is the number of steps to train.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from maskops.shape_rules import image_size_fits, image_stride
from maskops.spec.errors import FieldIssue
from maskops.spec.literals import decode_literal
from maskops.spec.weights_reference import is_url, is_weights_reference, split_weights_url

ImageSize = tuple[int, int]
"""(height, width) in pixels."""

AspectRatio = tuple[float, float]
"""(x, y): multiplies the base anchor's width by x and its height by y (TF/TAO convention)."""

NLAYERS = (10, 18, 34, 50, 101)
FREEZABLE_BLOCKS = (0, 1, 2, 3)
MIN_IMAGE_SIDE = 128
BACKBONE_MIN_LEVELS = (2, 5)
"""min_level range: the finest FPN level comes from a ResNet stage (C2..C5)."""
MAX_LEVEL_LIMIT = 8
_COCO_METRIC = re.compile(r"(mask_)?(AP|AP50|AP75|APs|APm|APl|ARmax1|ARmax10|ARmax100|ARs|ARm|ARl)")
"""The evaluation's metric names (maskops.evaluation.coco.metric_names; not imported here so
that the spec stays free of the evaluation's dependencies)."""
VALIDATION_LOSS = "val/Total loss"
"""The metric training evaluates without val_json_file (lower is better)."""
L1_WEIGHT_DECAY_LAYERS = ("all", "prunable")
"""Values of ``l1_weight_decay_layers``: see :attr:`ExperimentSpec.l1_weight_decay_layers`."""


def _decode_tao_string(value: Any) -> Any:
    """TAO writes list-valued fields as strings; decode those, pass anything else through."""
    return decode_literal(value) if isinstance(value, str) else value


def _check_positive(value: float) -> float:
    if value <= 0:
        raise ValueError(f"{value} must be > 0")
    return value


def _check_non_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"{value} must be >= 0")
    return value


def _check_unit_interval(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{value} must be in [0, 1]")
    return value


class _SpecModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False
    )

    @field_validator("*")
    @classmethod
    def _fits_int64(cls, value: Any) -> Any:
        # The text form stores integers as int64; a JSON spec must not hold what it cannot.
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            raise ValueError(f"{value} is out of range")
        return value


class DataConfig(_SpecModel):
    image_size: ImageSize = (832, 1344)
    augment_input_data: bool = True
    eval_samples: int = 0
    """0 = the whole validation set."""
    training_file_pattern: str = ""
    validation_file_pattern: str = ""
    val_json_file: str = ""
    num_classes: int = 91
    """Categories + 1 for background."""
    skip_crowd_during_training: bool = True
    prefetch_buffer_size: int = 0
    """Batches prefetched per loader worker; 0 = library default."""
    shuffle_buffer_size: int = 4096
    n_workers: int = 16
    """Data loader worker processes, capped by the machine's cores."""
    max_num_instances: int = 200

    PATH_FIELDS: ClassVar[tuple[str, ...]] = (
        "training_file_pattern",
        "validation_file_pattern",
        "val_json_file",
    )

    _decode = field_validator("image_size", mode="before")(_decode_tao_string)
    _positive = field_validator("max_num_instances")(_check_positive)
    _non_negative = field_validator(
        "eval_samples", "prefetch_buffer_size", "shuffle_buffer_size", "n_workers"
    )(_check_non_negative)

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, value: ImageSize) -> ImageSize:
        if min(value) < MIN_IMAGE_SIDE:
            raise ValueError(
                f"({value[0]}, {value[1]}): height and width must be >= {MIN_IMAGE_SIDE}"
            )
        return value

    @field_validator("num_classes")
    @classmethod
    def _num_classes(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"{value} must be >= 2 (categories + 1 for background)")
        return value


class MaskRCNNConfig(_SpecModel):
    arch: str = "resnet"
    nlayers: int = 50
    freeze_bn: bool = False
    freeze_blocks: list[int] = Field(default_factory=list)
    """Subset of [0, 1, 2, 3]: 0 is the stem, then the residual stages."""
    gt_mask_size: int = 112
    rpn_positive_overlap: float = 0.7
    rpn_negative_overlap: float = 0.3
    rpn_batch_size_per_im: int = 256
    rpn_fg_fraction: float = 0.5
    rpn_min_size: float = 0.0
    batch_size_per_im: int = 512
    fg_fraction: float = 0.25
    fg_thresh: float = 0.5
    bg_thresh_hi: float = 0.5
    bg_thresh_lo: float = 0.0
    fast_rcnn_mlp_head_dim: int = 1024
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    include_mask: bool = True
    mrcnn_resolution: int = 28
    train_rpn_pre_nms_topn: int = 2000
    """Per FPN level."""
    train_rpn_post_nms_topn: int = 1000
    train_rpn_nms_threshold: float = 0.7
    test_detections_per_image: int = 100
    test_nms: float = 0.5
    test_rpn_pre_nms_topn: int = 1000
    test_rpn_post_nms_topn: int = 1000
    test_rpn_nms_thresh: float = 0.7
    min_level: int = 2
    max_level: int = 6
    num_scales: int = 1
    aspect_ratios: list[AspectRatio] = Field(
        default_factory=lambda: [(1.0, 1.0), (1.4, 0.7), (0.7, 1.4)]
    )
    anchor_scale: float = 8.0
    rpn_box_loss_weight: float = 1.0
    fast_rcnn_box_loss_weight: float = 1.0
    mrcnn_weight_loss_mask: float = 1.0

    _decode = field_validator("freeze_blocks", "bbox_reg_weights", "aspect_ratios", mode="before")(
        _decode_tao_string
    )
    _positive = field_validator(
        "gt_mask_size",
        "rpn_batch_size_per_im",
        "batch_size_per_im",
        "fast_rcnn_mlp_head_dim",
        "mrcnn_resolution",
        "train_rpn_pre_nms_topn",
        "train_rpn_post_nms_topn",
        "test_detections_per_image",
        "test_rpn_pre_nms_topn",
        "test_rpn_post_nms_topn",
        "num_scales",
        "anchor_scale",
    )(_check_positive)
    _non_negative = field_validator(
        "rpn_min_size", "rpn_box_loss_weight", "fast_rcnn_box_loss_weight", "mrcnn_weight_loss_mask"
    )(_check_non_negative)
    _unit_interval = field_validator(
        "rpn_positive_overlap",
        "rpn_negative_overlap",
        "rpn_fg_fraction",
        "fg_fraction",
        "fg_thresh",
        "bg_thresh_hi",
        "bg_thresh_lo",
        "train_rpn_nms_threshold",
        "test_nms",
        "test_rpn_nms_thresh",
    )(_check_unit_interval)

    @field_validator("arch")
    @classmethod
    def _arch(cls, value: str) -> str:
        if value != "resnet":
            raise ValueError(f"{value!r} is not supported (only 'resnet')")
        return value

    @field_validator("nlayers")
    @classmethod
    def _nlayers(cls, value: int) -> int:
        if value not in NLAYERS:
            raise ValueError(f"{value} is not one of {', '.join(map(str, NLAYERS))}")
        return value

    @field_validator("freeze_blocks")
    @classmethod
    def _freeze_blocks(cls, value: list[int]) -> list[int]:
        allowed = list(FREEZABLE_BLOCKS)
        if any(block not in FREEZABLE_BLOCKS for block in value):
            raise ValueError(f"{value} is not a subset of {allowed}")
        if len(set(value)) != len(value):
            raise ValueError(f"{value} lists a block more than once")
        return value

    @field_validator("mrcnn_resolution")
    @classmethod
    def _mrcnn_resolution(cls, value: int) -> int:
        if value % 4:
            raise ValueError(f"{value} is not a multiple of 4")
        return value

    @field_validator("bbox_reg_weights")
    @classmethod
    def _bbox_reg_weights(
        cls, value: tuple[float, float, float, float]
    ) -> tuple[float, float, float, float]:
        if any(w <= 0 for w in value):
            raise ValueError(f"{value}: every weight must be > 0")
        return value

    @field_validator("aspect_ratios")
    @classmethod
    def _aspect_ratios(cls, value: list[AspectRatio]) -> list[AspectRatio]:
        if not value:
            raise ValueError("at least one (x, y) aspect ratio is needed")
        if any(x <= 0 or y <= 0 for x, y in value):
            raise ValueError(f"{value}: every factor must be > 0")
        return value

    @field_validator("min_level")
    @classmethod
    def _min_level(cls, value: int) -> int:
        low, high = BACKBONE_MIN_LEVELS
        if not low <= value <= high:
            raise ValueError(
                f"{value} must be in {low}..{high} (FPN levels start at a ResNet stage)"
            )
        return value

    @field_validator("max_level")
    @classmethod
    def _max_level(cls, value: int) -> int:
        if value > MAX_LEVEL_LIMIT:
            raise ValueError(f"{value} must be <= {MAX_LEVEL_LIMIT}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> MaskRCNNConfig:
        if self.min_level >= self.max_level:
            raise FieldIssue(
                "max_level",
                f"{self.max_level} must be greater than min_level ({self.min_level})",
                related=("min_level",),
            )
        if self.rpn_negative_overlap > self.rpn_positive_overlap:
            raise FieldIssue(
                "rpn_negative_overlap",
                f"{self.rpn_negative_overlap} must be <= rpn_positive_overlap "
                f"({self.rpn_positive_overlap})",
                related=("rpn_positive_overlap",),
            )
        if self.bg_thresh_lo > self.bg_thresh_hi:
            raise FieldIssue(
                "bg_thresh_lo",
                f"{self.bg_thresh_lo} must be <= bg_thresh_hi ({self.bg_thresh_hi})",
                related=("bg_thresh_hi",),
            )
        return self


class WandBConfig(_SpecModel):
    """TAO's ``wandb_config``: log the run to Weights & Biases (needs ``maskops[wandb]``)."""

    enabled: bool = False
    key: str = ""
    """API key; "" = the one ``wandb login`` stored (or WANDB_API_KEY)."""
    project: str = ""
    entity: str = ""
    reinit: bool = False
    name: str = ""
    tags: list[str] = Field(default_factory=list)
    wandb_dir: str = ""
    notes: str = ""
    mode: Literal["ONLINE", "OFFLINE", "DISABLED"] = "ONLINE"

    @property
    def active(self) -> bool:
        """Whether training logs to W&B: enabled and not in DISABLED mode."""
        return self.enabled and self.mode != "DISABLED"


class ClearMLConfig(_SpecModel):
    """TAO's ``clearml_config``: log the run to ClearML (needs ``maskops[clearml]``). TAO's
    message has no on/off switch: writing the block turns ClearML on."""

    project: str = ""
    task: str = ""
    tags: list[str] = Field(default_factory=list)
    reuse_last_task_id: bool = False
    continue_last_task: bool = False
    deferred_init: bool = False


_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class MLflowConfig(_SpecModel):
    """maskops extension ``mlflow_config``: log the run to MLflow (needs
    ``maskops[mlflow]``). Writing the block turns MLflow on, as ``clearml_config`` does."""

    tracking_uri: str = ""
    """A local directory (MLflow's file store; relative paths as for ``checkpoint``) or a
    URI MLflow understands (``http(s)://`` tracking server, ``databricks``,
    ``sqlite:///...``). "" = MLFLOW_TRACKING_URI when set, else RESULTS_DIR/mlruns."""
    experiment_name: str = ""
    """"" = ``maskops``."""
    run_name: str = ""
    """"" = MLflow's generated name."""
    tags: list[str] = Field(default_factory=list)
    """Run tags, each ``key=value`` (a bare ``key`` gets the value "")."""

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if not tag.partition("=")[0].strip():
                raise ValueError(f"tag {tag!r} has no key (write key=value)")
        return tags

    @property
    def tag_dict(self) -> dict[str, str]:
        return {k.strip(): v for k, _, v in (tag.partition("=") for tag in self.tags)}

    @property
    def local_store(self) -> bool:
        """Whether ``tracking_uri`` is a local directory (a path, or a ``file:`` URI)."""
        uri = self.tracking_uri
        if uri == "databricks":
            return False
        return not _URI_SCHEME.match(uri) or uri.startswith("file:")


class ExperimentSpec(_SpecModel):
    seed: int = 123
    use_amp: bool = False
    warmup_steps: int = 0
    warmup_learning_rate: float = 0.0001
    init_learning_rate: float = 0.02
    learning_rate_steps: list[int] = Field(default_factory=list)
    learning_rate_decay_levels: list[float] = Field(default_factory=list)
    total_steps: int = 0
    """Steps to train when num_epochs is 0; see :attr:`resolved_total_steps`."""
    num_epochs: int = 0
    """0 = unset: train for total_steps."""
    num_examples_per_epoch: int = 0
    train_batch_size: int = 4
    eval_batch_size: int = 8
    num_steps_per_eval: int = 0
    """0 = only at the end of training."""
    momentum: float = 0.9
    l1_weight_decay: float = 0.0
    l2_weight_decay: float = 0.0001
    checkpoint: str = ""
    """Weights to start from: a local path of torchvision or maskops weights, a torchvision
    weights name (``ResNet50_Weights.IMAGENET1K_V2``) or ``URL#sha256=HEX`` (see
    :mod:`maskops.spec.weights_reference`); "" = random init."""
    skip_checkpoint_variables: str = ""
    """Regex over parameter names not to load from ``checkpoint``."""
    pruned_model_path: str = ""
    visualize_images_summary: bool = False
    save_checkpoints_steps: int = 0
    """Steps between checkpoints; 0 = every num_steps_per_eval steps. Always at the end."""
    global_gradient_clip_ratio: float = 0.0
    """Clip the global L2 norm of the gradients to this value before each update; 0 = off."""
    logging_frequency: int = 0
    """Steps between training-metric logs (log, metrics.jsonl, TensorBoard); 0 = 10."""
    report_frequency: int = 0
    """Steps between status reports (``status.json``, the job's progress); 0 = at most one
    a second."""
    wandb_config: WandBConfig | None = None
    """None = the spec has no ``wandb_config`` block."""
    clearml_config: ClearMLConfig | None = None
    """None = the spec has no ``clearml_config`` block (ClearML off)."""

    # maskops extensions (absent from TAO specs).
    keep_checkpoints: int = 5
    """maskops extension: how many of the most recent checkpoints to keep."""
    accumulate_grad_steps: int = 1
    """maskops extension: gradient accumulation (effective batch = batch * this * gpus)."""
    target_box_ap: float = 0.0
    """maskops extension: stop training once validation box AP reaches this (0 = off)."""
    target_mask_ap: float = 0.0
    """maskops extension: stop training once validation mask AP reaches this (0 = off)."""
    l1_weight_decay_layers: str = "all"
    """maskops extension: the kernels l1_weight_decay applies to. "all" (TAO): every conv and
    linear kernel. "prunable": only those ``maskops prune`` may cut (backbone, FPN, RPN conv),
    the sparsity training that leaves the RoI heads' large layers alone."""
    best_checkpoint_metric: str = ""
    """maskops extension: the validation metric by which training keeps ``model.best.pth``:
    a COCO metric (``mask_AP``, ``AP50``, ...; higher is better) or ``val/Total loss``
    (lower is better). "" = mask_AP (AP without masks), or val/Total loss when the spec
    has no val_json_file."""
    mlflow_config: MLflowConfig | None = None
    """maskops extension: None = the spec has no ``mlflow_config`` block (MLflow off)."""

    data_config: DataConfig = Field(default_factory=DataConfig)
    maskrcnn_config: MaskRCNNConfig = Field(default_factory=MaskRCNNConfig)

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("checkpoint", "pruned_model_path")
    OPTIONAL_TAO_FIELDS: ClassVar[tuple[str, ...]] = (
        "save_checkpoints_steps",
        "global_gradient_clip_ratio",
        "logging_frequency",
        "report_frequency",
        "wandb_config",
        "clearml_config",
    )
    """TAO fields that its sample specs leave out; the text form writes them only when set."""
    EXTENSION_FIELDS: ClassVar[tuple[str, ...]] = (
        "keep_checkpoints",
        "accumulate_grad_steps",
        "target_box_ap",
        "target_mask_ap",
        "l1_weight_decay_layers",
        "best_checkpoint_metric",
        "mlflow_config",
    )

    _decode = field_validator("learning_rate_steps", "learning_rate_decay_levels", mode="before")(
        _decode_tao_string
    )
    _positive = field_validator(
        "train_batch_size",
        "eval_batch_size",
        "init_learning_rate",
        "keep_checkpoints",
        "accumulate_grad_steps",
    )(_check_positive)
    _non_negative = field_validator(
        "seed",
        "warmup_steps",
        "warmup_learning_rate",
        "total_steps",
        "num_epochs",
        "num_examples_per_epoch",
        "num_steps_per_eval",
        "l1_weight_decay",
        "l2_weight_decay",
        "save_checkpoints_steps",
        "global_gradient_clip_ratio",
        "logging_frequency",
        "report_frequency",
    )(_check_non_negative)
    _unit_interval = field_validator("target_box_ap", "target_mask_ap")(_check_unit_interval)

    @field_validator("l1_weight_decay_layers")
    @classmethod
    def _l1_weight_decay_layers(cls, value: str) -> str:
        if value not in L1_WEIGHT_DECAY_LAYERS:
            raise ValueError(f"{value!r} must be one of {', '.join(L1_WEIGHT_DECAY_LAYERS)}")
        return value

    @field_validator("best_checkpoint_metric")
    @classmethod
    def _best_checkpoint_metric(cls, value: str) -> str:
        if value and value != VALIDATION_LOSS and not _COCO_METRIC.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a validation metric (a COCO metric such as mask_AP, AP50, "
                f"ARmax100, or {VALIDATION_LOSS!r})"
            )
        return value

    @property
    def resolved_best_checkpoint_metric(self) -> str:
        """The metric ``model.best.pth`` is chosen by (see best_checkpoint_metric)."""
        if self.best_checkpoint_metric:
            return self.best_checkpoint_metric
        if not self.data_config.val_json_file:
            return VALIDATION_LOSS
        return "mask_AP" if self.maskrcnn_config.include_mask else "AP"

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int) -> int:
        if value >= 2**32:
            raise ValueError(f"{value} must be < 2^32")
        return value

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{value} must be in [0, 1)")
        return value

    @field_validator("learning_rate_steps")
    @classmethod
    def _learning_rate_steps(cls, value: list[int]) -> list[int]:
        if any(step <= 0 for step in value):
            raise ValueError(f"{value}: steps must be > 0")
        if any(b <= a for a, b in pairwise(value)):
            raise ValueError(f"{value} must be strictly increasing")
        return value

    @field_validator("learning_rate_decay_levels")
    @classmethod
    def _learning_rate_decay_levels(cls, value: list[float]) -> list[float]:
        if any(level <= 0 for level in value):
            raise ValueError(f"{value}: levels must be > 0")
        return value

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, value: str) -> str:
        if is_url(value):
            split_weights_url(value)
        return value

    @field_validator("skip_checkpoint_variables")
    @classmethod
    def _skip_checkpoint_variables(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentSpec:
        steps, levels = self.learning_rate_steps, self.learning_rate_decay_levels
        if len(steps) != len(levels):
            raise FieldIssue(
                "learning_rate_decay_levels",
                f"{len(levels)} levels for {len(steps)} learning_rate_steps; "
                "they must have the same length",
                related=("learning_rate_steps",),
            )
        if self.num_epochs > 0 and self.num_examples_per_epoch <= 0:
            raise FieldIssue(
                "num_examples_per_epoch",
                f"required (> 0) when num_epochs is set ({self.num_epochs}): "
                "total_steps = num_epochs * num_examples_per_epoch / train_batch_size",
                related=("num_epochs",),
            )
        if (
            self.best_checkpoint_metric.startswith("mask_")
            and not self.maskrcnn_config.include_mask
        ):
            raise FieldIssue(
                "best_checkpoint_metric",
                f"{self.best_checkpoint_metric!r} needs masks, but maskrcnn_config.include_mask "
                "is false",
                related=("maskrcnn_config.include_mask",),
            )
        height, width = self.data_config.image_size
        if not image_size_fits((height, width), self.maskrcnn_config.max_level):
            stride = image_stride(self.maskrcnn_config.max_level)
            raise FieldIssue(
                "data_config.image_size",
                f"({height}, {width}): height and width must be multiples of "
                f"2^max_level = {stride}",
                related=("maskrcnn_config.max_level",),
            )
        return self

    @property
    def enabled_trackers(self) -> list[str]:
        """The spec blocks whose tracker is on: ``wandb_config`` when enabled and not in
        DISABLED mode; ``clearml_config`` and ``mlflow_config`` whenever the block is
        written."""
        names = []
        if self.wandb_config is not None and self.wandb_config.active:
            names.append("wandb_config")
        if self.clearml_config is not None:
            names.append("clearml_config")
        if self.mlflow_config is not None:
            names.append("mlflow_config")
        return names

    @property
    def resolved_total_steps(self) -> int:
        """Steps to train: ``num_epochs * num_examples_per_epoch / train_batch_size`` rounded
        up when num_epochs is set (as TAO's train.py does, the last partial batch is a step
        and num_epochs wins over total_steps), else ``total_steps``."""
        if self.num_epochs > 0:
            examples = self.num_epochs * self.num_examples_per_epoch
            return -(-examples // self.train_batch_size)
        return self.total_steps

    def resolve_paths(self, base_dir: str | Path) -> ExperimentSpec:
        """A copy whose relative path fields are made absolute against ``base_dir``.

        Paths of a spec file are relative to the file's directory; the CLI and the workers
        call this (``load_spec`` does not, so that a spec round-trips unchanged). ``~`` is
        expanded; empty fields, weights names and URLs stay as they are.
        """
        base = Path(base_dir).expanduser().absolute()

        def resolved(value: str) -> str:
            if not value:
                return value
            path = Path(value).expanduser()
            return str(path if path.is_absolute() else base / path)

        data = self.data_config.model_copy(
            update={f: resolved(getattr(self.data_config, f)) for f in DataConfig.PATH_FIELDS}
        )
        update: dict[str, Any] = {f: resolved(getattr(self, f)) for f in self.PATH_FIELDS}
        if is_weights_reference(self.checkpoint):
            update["checkpoint"] = self.checkpoint
        update["data_config"] = data
        mlflow = self.mlflow_config
        if mlflow is not None and mlflow.local_store and mlflow.tracking_uri:
            path = mlflow.tracking_uri.removeprefix("file://").removeprefix("file:")
            update["mlflow_config"] = mlflow.model_copy(update={"tracking_uri": resolved(path)})
        return self.model_copy(update=update, deep=True)
