"""Every task, declared once: its ``maskops`` subcommand and job action name, its options
(a dataclass whose fields are :func:`maskops.options_schema.option`) and its entry function.

The command line builds each subcommand's option flags from here
(:mod:`maskops.cli.options`), the control plane builds each job action's REST options model
(``maskops_core.options``) and the worker reads a job's options back into the same
dataclass. Standard library only: the control-plane core imports it without the engine's
libraries (the entry functions are named, not imported).
"""

from __future__ import annotations

from maskops.automl.options import AutomlOptions
from maskops.data.convert_options import ConvertOptions
from maskops.evaluation.inference_options import InferenceOptions
from maskops.evaluation.options import EvaluateOptions
from maskops.export.engine_options import GenTrtEngineOptions
from maskops.export.options import ExportOptions
from maskops.options_schema import TaskDeclaration
from maskops.prune.options import PruneOptions
from maskops.serving.publish_options import PublishOptions
from maskops.training.train_options import TrainOptions

DATASET_CONVERT = TaskDeclaration(
    name="dataset_convert",
    options=ConvertOptions,
    entry="maskops.data.formats.convert_labelled_dataset",
    summary="convert a COCO instances dataset into training shards",
)
TRAIN = TaskDeclaration(
    name="train",
    options=TrainOptions,
    entry="maskops.training.train.run_training",
    summary="train Mask R-CNN on the spec's shards (resumes in the same results dir)",
)
EVALUATE = TaskDeclaration(
    name="evaluate",
    options=EvaluateOptions,
    entry="maskops.evaluation.runner.run_evaluation",
    summary="COCO box and mask metrics of a model on the spec's validation data",
    takes_model=True,
)
INFERENCE = TaskDeclaration(
    name="inference",
    options=InferenceOptions,
    entry="maskops.evaluation.inference.run_inference",
    summary="detect objects in a directory of images; write annotated images and COCO JSON",
    takes_model=True,
)
PRUNE = TaskDeclaration(
    name="prune",
    options=PruneOptions,
    entry="maskops.prune.run.run_prune",
    summary="remove low-norm conv filters from the backbone and FPN",
    takes_model=True,
)

EXPORT = TaskDeclaration(
    name="export",
    options=ExportOptions,
    entry="maskops.export.export_onnx",
    summary="export a model to ONNX (fp32, fp16, int8 QDQ), validated against PyTorch",
    takes_model=True,
)

GEN_TRT_ENGINE = TaskDeclaration(
    name="gen_trt_engine",
    options=GenTrtEngineOptions,
    entry="maskops.export.tensorrt.build_engine",
    summary="build a TensorRT engine from an exported ONNX (tao-deploy's gen_trt_engine)",
    # Built on the serving host, by the TensorRT of the Triton that loads it.
    job_action=False,
)
PUBLISH = TaskDeclaration(
    name="publish",
    options=PublishOptions,
    entry="maskops.serving.rollout.publish_and_roll_out",
    summary="add an exported ONNX to a Triton model repository as a new version",
)
AUTOML = TaskDeclaration(
    name="automl",
    options=AutomlOptions,
    entry="maskops.automl.search.run_search",
    summary="search hyperparameters (Optuna): train trials of the spec, keep the best",
)

TASKS: dict[str, TaskDeclaration] = {
    task.name: task
    for task in (
        DATASET_CONVERT,
        TRAIN,
        AUTOML,
        EVALUATE,
        INFERENCE,
        PRUNE,
        EXPORT,
        GEN_TRT_ENGINE,
        PUBLISH,
    )
}
"""Every declared task by name."""
