from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataConfig(_message.Message):
    __slots__ = ("image_size", "augment_input_data", "eval_samples", "training_file_pattern", "validation_file_pattern", "val_json_file", "num_classes", "skip_crowd_during_training", "prefetch_buffer_size", "shuffle_buffer_size", "n_workers", "max_num_instances")
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUGMENT_INPUT_DATA_FIELD_NUMBER: _ClassVar[int]
    EVAL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FILE_PATTERN_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FILE_PATTERN_FIELD_NUMBER: _ClassVar[int]
    VAL_JSON_FILE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SKIP_CROWD_DURING_TRAINING_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    N_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    image_size: str
    augment_input_data: bool
    eval_samples: int
    training_file_pattern: str
    validation_file_pattern: str
    val_json_file: str
    num_classes: int
    skip_crowd_during_training: bool
    prefetch_buffer_size: int
    shuffle_buffer_size: int
    n_workers: int
    max_num_instances: int
    def __init__(self, image_size: _Optional[str] = ..., augment_input_data: bool = ..., eval_samples: _Optional[int] = ..., training_file_pattern: _Optional[str] = ..., validation_file_pattern: _Optional[str] = ..., val_json_file: _Optional[str] = ..., num_classes: _Optional[int] = ..., skip_crowd_during_training: bool = ..., prefetch_buffer_size: _Optional[int] = ..., shuffle_buffer_size: _Optional[int] = ..., n_workers: _Optional[int] = ..., max_num_instances: _Optional[int] = ...) -> None: ...

class MaskRCNNConfig(_message.Message):
    __slots__ = ("arch", "nlayers", "freeze_bn", "freeze_blocks", "gt_mask_size", "rpn_positive_overlap", "rpn_negative_overlap", "rpn_batch_size_per_im", "rpn_fg_fraction", "rpn_min_size", "batch_size_per_im", "fg_fraction", "fg_thresh", "bg_thresh_hi", "bg_thresh_lo", "fast_rcnn_mlp_head_dim", "bbox_reg_weights", "include_mask", "mrcnn_resolution", "train_rpn_pre_nms_topn", "train_rpn_post_nms_topn", "train_rpn_nms_threshold", "test_detections_per_image", "test_nms", "test_rpn_pre_nms_topn", "test_rpn_post_nms_topn", "test_rpn_nms_thresh", "min_level", "max_level", "num_scales", "aspect_ratios", "anchor_scale", "rpn_box_loss_weight", "fast_rcnn_box_loss_weight", "mrcnn_weight_loss_mask")
    ARCH_FIELD_NUMBER: _ClassVar[int]
    NLAYERS_FIELD_NUMBER: _ClassVar[int]
    FREEZE_BN_FIELD_NUMBER: _ClassVar[int]
    FREEZE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    GT_MASK_SIZE_FIELD_NUMBER: _ClassVar[int]
    RPN_POSITIVE_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    RPN_NEGATIVE_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    RPN_BATCH_SIZE_PER_IM_FIELD_NUMBER: _ClassVar[int]
    RPN_FG_FRACTION_FIELD_NUMBER: _ClassVar[int]
    RPN_MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_PER_IM_FIELD_NUMBER: _ClassVar[int]
    FG_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FG_THRESH_FIELD_NUMBER: _ClassVar[int]
    BG_THRESH_HI_FIELD_NUMBER: _ClassVar[int]
    BG_THRESH_LO_FIELD_NUMBER: _ClassVar[int]
    FAST_RCNN_MLP_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BBOX_REG_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MASK_FIELD_NUMBER: _ClassVar[int]
    MRCNN_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_RPN_PRE_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    TRAIN_RPN_POST_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    TRAIN_RPN_NMS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TEST_DETECTIONS_PER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    TEST_NMS_FIELD_NUMBER: _ClassVar[int]
    TEST_RPN_PRE_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    TEST_RPN_POST_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    TEST_RPN_NMS_THRESH_FIELD_NUMBER: _ClassVar[int]
    MIN_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_LEVEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SCALES_FIELD_NUMBER: _ClassVar[int]
    ASPECT_RATIOS_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_SCALE_FIELD_NUMBER: _ClassVar[int]
    RPN_BOX_LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    FAST_RCNN_BOX_LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MRCNN_WEIGHT_LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    arch: str
    nlayers: int
    freeze_bn: bool
    freeze_blocks: str
    gt_mask_size: int
    rpn_positive_overlap: float
    rpn_negative_overlap: float
    rpn_batch_size_per_im: int
    rpn_fg_fraction: float
    rpn_min_size: float
    batch_size_per_im: int
    fg_fraction: float
    fg_thresh: float
    bg_thresh_hi: float
    bg_thresh_lo: float
    fast_rcnn_mlp_head_dim: int
    bbox_reg_weights: str
    include_mask: bool
    mrcnn_resolution: int
    train_rpn_pre_nms_topn: int
    train_rpn_post_nms_topn: int
    train_rpn_nms_threshold: float
    test_detections_per_image: int
    test_nms: float
    test_rpn_pre_nms_topn: int
    test_rpn_post_nms_topn: int
    test_rpn_nms_thresh: float
    min_level: int
    max_level: int
    num_scales: int
    aspect_ratios: str
    anchor_scale: float
    rpn_box_loss_weight: float
    fast_rcnn_box_loss_weight: float
    mrcnn_weight_loss_mask: float
    def __init__(self, arch: _Optional[str] = ..., nlayers: _Optional[int] = ..., freeze_bn: bool = ..., freeze_blocks: _Optional[str] = ..., gt_mask_size: _Optional[int] = ..., rpn_positive_overlap: _Optional[float] = ..., rpn_negative_overlap: _Optional[float] = ..., rpn_batch_size_per_im: _Optional[int] = ..., rpn_fg_fraction: _Optional[float] = ..., rpn_min_size: _Optional[float] = ..., batch_size_per_im: _Optional[int] = ..., fg_fraction: _Optional[float] = ..., fg_thresh: _Optional[float] = ..., bg_thresh_hi: _Optional[float] = ..., bg_thresh_lo: _Optional[float] = ..., fast_rcnn_mlp_head_dim: _Optional[int] = ..., bbox_reg_weights: _Optional[str] = ..., include_mask: bool = ..., mrcnn_resolution: _Optional[int] = ..., train_rpn_pre_nms_topn: _Optional[int] = ..., train_rpn_post_nms_topn: _Optional[int] = ..., train_rpn_nms_threshold: _Optional[float] = ..., test_detections_per_image: _Optional[int] = ..., test_nms: _Optional[float] = ..., test_rpn_pre_nms_topn: _Optional[int] = ..., test_rpn_post_nms_topn: _Optional[int] = ..., test_rpn_nms_thresh: _Optional[float] = ..., min_level: _Optional[int] = ..., max_level: _Optional[int] = ..., num_scales: _Optional[int] = ..., aspect_ratios: _Optional[str] = ..., anchor_scale: _Optional[float] = ..., rpn_box_loss_weight: _Optional[float] = ..., fast_rcnn_box_loss_weight: _Optional[float] = ..., mrcnn_weight_loss_mask: _Optional[float] = ...) -> None: ...

class WandBConfig(_message.Message):
    __slots__ = ("enabled", "key", "project", "entity", "reinit", "name", "tags", "wandb_dir", "notes", "mode")
    class MODE(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ONLINE: _ClassVar[WandBConfig.MODE]
        OFFLINE: _ClassVar[WandBConfig.MODE]
        DISABLED: _ClassVar[WandBConfig.MODE]
    ONLINE: WandBConfig.MODE
    OFFLINE: WandBConfig.MODE
    DISABLED: WandBConfig.MODE
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    REINIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WANDB_DIR_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    key: str
    project: str
    entity: str
    reinit: bool
    name: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    wandb_dir: str
    notes: str
    mode: WandBConfig.MODE
    def __init__(self, enabled: bool = ..., key: _Optional[str] = ..., project: _Optional[str] = ..., entity: _Optional[str] = ..., reinit: bool = ..., name: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., wandb_dir: _Optional[str] = ..., notes: _Optional[str] = ..., mode: _Optional[_Union[WandBConfig.MODE, str]] = ...) -> None: ...

class ClearMLConfig(_message.Message):
    __slots__ = ("project", "task", "tags", "reuse_last_task_id", "continue_last_task", "deferred_init")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    REUSE_LAST_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_LAST_TASK_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_INIT_FIELD_NUMBER: _ClassVar[int]
    project: str
    task: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    reuse_last_task_id: bool
    continue_last_task: bool
    deferred_init: bool
    def __init__(self, project: _Optional[str] = ..., task: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., reuse_last_task_id: bool = ..., continue_last_task: bool = ..., deferred_init: bool = ...) -> None: ...

class MLflowConfig(_message.Message):
    __slots__ = ("tracking_uri", "experiment_name", "run_name", "tags")
    TRACKING_URI_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tracking_uri: str
    experiment_name: str
    run_name: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tracking_uri: _Optional[str] = ..., experiment_name: _Optional[str] = ..., run_name: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class Experiment(_message.Message):
    __slots__ = ("seed", "use_amp", "warmup_steps", "warmup_learning_rate", "init_learning_rate", "learning_rate_steps", "learning_rate_decay_levels", "total_steps", "num_epochs", "num_examples_per_epoch", "train_batch_size", "eval_batch_size", "num_steps_per_eval", "momentum", "l1_weight_decay", "l2_weight_decay", "checkpoint", "skip_checkpoint_variables", "pruned_model_path", "visualize_images_summary", "save_checkpoints_steps", "global_gradient_clip_ratio", "report_frequency", "logging_frequency", "data_config", "maskrcnn_config", "wandb_config", "clearml_config", "keep_checkpoints", "accumulate_grad_steps", "target_box_ap", "target_mask_ap", "l1_weight_decay_layers", "best_checkpoint_metric", "mlflow_config")
    SEED_FIELD_NUMBER: _ClassVar[int]
    USE_AMP_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    INIT_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_STEPS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_DECAY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EVAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_PER_EVAL_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    L1_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    L2_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SKIP_CHECKPOINT_VARIABLES_FIELD_NUMBER: _ClassVar[int]
    PRUNED_MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    VISUALIZE_IMAGES_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SAVE_CHECKPOINTS_STEPS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_GRADIENT_CLIP_RATIO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    LOGGING_FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    DATA_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MASKRCNN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    WANDB_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CLEARML_CONFIG_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATE_GRAD_STEPS_FIELD_NUMBER: _ClassVar[int]
    TARGET_BOX_AP_FIELD_NUMBER: _ClassVar[int]
    TARGET_MASK_AP_FIELD_NUMBER: _ClassVar[int]
    L1_WEIGHT_DECAY_LAYERS_FIELD_NUMBER: _ClassVar[int]
    BEST_CHECKPOINT_METRIC_FIELD_NUMBER: _ClassVar[int]
    MLFLOW_CONFIG_FIELD_NUMBER: _ClassVar[int]
    seed: int
    use_amp: bool
    warmup_steps: int
    warmup_learning_rate: float
    init_learning_rate: float
    learning_rate_steps: str
    learning_rate_decay_levels: str
    total_steps: int
    num_epochs: int
    num_examples_per_epoch: int
    train_batch_size: int
    eval_batch_size: int
    num_steps_per_eval: int
    momentum: float
    l1_weight_decay: float
    l2_weight_decay: float
    checkpoint: str
    skip_checkpoint_variables: str
    pruned_model_path: str
    visualize_images_summary: bool
    save_checkpoints_steps: int
    global_gradient_clip_ratio: float
    report_frequency: int
    logging_frequency: int
    data_config: DataConfig
    maskrcnn_config: MaskRCNNConfig
    wandb_config: WandBConfig
    clearml_config: ClearMLConfig
    keep_checkpoints: int
    accumulate_grad_steps: int
    target_box_ap: float
    target_mask_ap: float
    l1_weight_decay_layers: str
    best_checkpoint_metric: str
    mlflow_config: MLflowConfig
    def __init__(self, seed: _Optional[int] = ..., use_amp: bool = ..., warmup_steps: _Optional[int] = ..., warmup_learning_rate: _Optional[float] = ..., init_learning_rate: _Optional[float] = ..., learning_rate_steps: _Optional[str] = ..., learning_rate_decay_levels: _Optional[str] = ..., total_steps: _Optional[int] = ..., num_epochs: _Optional[int] = ..., num_examples_per_epoch: _Optional[int] = ..., train_batch_size: _Optional[int] = ..., eval_batch_size: _Optional[int] = ..., num_steps_per_eval: _Optional[int] = ..., momentum: _Optional[float] = ..., l1_weight_decay: _Optional[float] = ..., l2_weight_decay: _Optional[float] = ..., checkpoint: _Optional[str] = ..., skip_checkpoint_variables: _Optional[str] = ..., pruned_model_path: _Optional[str] = ..., visualize_images_summary: bool = ..., save_checkpoints_steps: _Optional[int] = ..., global_gradient_clip_ratio: _Optional[float] = ..., report_frequency: _Optional[int] = ..., logging_frequency: _Optional[int] = ..., data_config: _Optional[_Union[DataConfig, _Mapping]] = ..., maskrcnn_config: _Optional[_Union[MaskRCNNConfig, _Mapping]] = ..., wandb_config: _Optional[_Union[WandBConfig, _Mapping]] = ..., clearml_config: _Optional[_Union[ClearMLConfig, _Mapping]] = ..., keep_checkpoints: _Optional[int] = ..., accumulate_grad_steps: _Optional[int] = ..., target_box_ap: _Optional[float] = ..., target_mask_ap: _Optional[float] = ..., l1_weight_decay_layers: _Optional[str] = ..., best_checkpoint_metric: _Optional[str] = ..., mlflow_config: _Optional[_Union[MLflowConfig, _Mapping]] = ...) -> None: ...
