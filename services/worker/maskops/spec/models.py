"""Typed experiment spec: the JSON form of a TAO ``mask_rcnn`` experiment spec.

This is the one config object of maskops. The text form (protobuf text format, exactly as
TAO writes it) is parsed in :mod:`maskops.spec.text`; both forms end up here. String-valued
lists of the text form ("(832, 1344)", "[(1.0, 1.0), (1.4, 0.7)]") are typed values here.

Defaults are TAO's published sample spec and field table (see ARCHITECTURE.md). Fields
marked "maskops extension" do not exist in TAO; a TAO spec never needs them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

ImageSize = tuple[int, int]
"""(height, width) in pixels."""

AspectRatio = tuple[float, float]
"""(x, y): multiplies the base anchor's width by x and its height by y (TF/TAO convention)."""


class _SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


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


class ExperimentSpec(_SpecModel):
    seed: int = 123
    use_amp: bool = False
    warmup_steps: int = 0
    warmup_learning_rate: float = 0.0001
    init_learning_rate: float = 0.02
    learning_rate_steps: list[int] = Field(default_factory=list)
    learning_rate_decay_levels: list[float] = Field(default_factory=list)
    total_steps: int = 0
    """Derived from num_epochs when that is set."""
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
    """Local path of torchvision or maskops weights to start from; "" = random init."""
    skip_checkpoint_variables: str = ""
    """Regex over parameter names not to load from ``checkpoint``."""
    pruned_model_path: str = ""
    visualize_images_summary: bool = False

    # maskops extensions (absent from TAO specs).
    keep_checkpoints: int = 5
    """maskops extension: how many of the most recent checkpoints to keep."""
    accumulate_grad_steps: int = 1
    """maskops extension: gradient accumulation (effective batch = batch * this * gpus)."""
    target_box_ap: float = 0.0
    """maskops extension: stop training once validation box AP reaches this (0 = off)."""
    target_mask_ap: float = 0.0
    """maskops extension: stop training once validation mask AP reaches this (0 = off)."""

    data_config: DataConfig = Field(default_factory=DataConfig)
    maskrcnn_config: MaskRCNNConfig = Field(default_factory=MaskRCNNConfig)
