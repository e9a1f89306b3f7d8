"""``maskops export``: checkpoint -> validated ONNX (fp32 / fp16 / int8 QDQ) [+ engine, DS files].

Every export is checked before it is written: the ONNX runs in onnxruntime on real
validation images and its detections are compared with the PyTorch model's
(:mod:`maskops.export.parity`); an export that disagrees raises :class:`ExportError` and
leaves no file behind. int8 additionally reports the validation mask AP of the int8 graph
against the fp32 PyTorch model.

A graph bound for TensorRT (``target="tensorrt"``, an engine requested, or TAO's layout,
which DeepStream builds an engine from) is also checked against TensorRT's ONNX import rules
(:mod:`maskops.export.tensorrt_rules`) before anything is written; its int8 form is the
symmetric one TensorRT imports (:func:`maskops.export.precision.quantize_int8`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import onnx
import torch

from maskops.atomic import atomic_path
from maskops.data.labels import LabelMap
from maskops.data.transforms import resize_and_pad
from maskops.evaluation.coco import IouType
from maskops.evaluation.predictor import TorchPredictor
from maskops.export.batching import batch_over_images
from maskops.export.deepstream import write_deepstream_files
from maskops.export.folding import fold_shape_arithmetic
from maskops.export.graph import (
    MAX_OPSET,
    MIN_OPSET,
    OPSET,
    GraphMetadata,
    describe_io,
    output_row_shapes,
    set_metadata,
    trace_to_onnx,
)
from maskops.export.parity import ParityReport, Tolerances, compare_detections
from maskops.export.precision import convert_to_fp16, quantize_int8, write_calibration_cache
from maskops.export.predictor import OnnxPredictor
from maskops.export.tao_layout import choose_output_layout, tao_layout_problems, to_tao_layout
from maskops.export.tensorrt import (
    ENGINE_ELSEWHERE,
    BatchProfile,
    EngineBuildError,
    batch_profile,
    build_engine,
    tensorrt_unavailable_reason,
)
from maskops.export.tensorrt_rules import check_tensorrt_graph, describe, required_plugins
from maskops.shape_rules import image_size_fits, image_stride
from maskops.spec.models import ExperimentSpec

DataType = Literal["fp32", "fp16", "int8"]
DATA_TYPES: tuple[str, ...] = ("fp32", "fp16", "int8")
TARGETS: tuple[str, ...] = ("onnxruntime", "tensorrt")
"""What the graph is for: onnxruntime (portable; uint8 int8) or TensorRT (checked against
its import rules; symmetric int8). Requesting an engine implies "tensorrt"."""
INT8_MIN_OPSET = 13


class ExportError(ValueError):
    """An export that cannot be made or did not validate; the message says which and why."""


@dataclass
class ExportResult:
    onnx_path: Path
    data_type: str
    metadata: GraphMetadata
    profile: BatchProfile
    """The TensorRT profile's batch sizes (used when an engine is built)."""
    parity: ParityReport
    io: dict[str, Any]
    report_path: Path
    cal_cache_file: Path | None = None
    calibration_images: int = 0
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """int8 only: {"fp32": COCO metrics of the PyTorch model, "int8": of the int8 graph}."""
    engine_file: Path | None = None
    engine_note: str = ""
    target: str = "onnxruntime"
    tensorrt_plugins: list[str] = field(default_factory=list)
    """TensorRT plugins the graph's import needs (tensorrt target only)."""
    deepstream_files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mask_ap_drop(self) -> float | None:
        if "fp32" not in self.metrics or "int8" not in self.metrics:
            return None
        key = "mask_AP" if "mask_AP" in self.metrics["fp32"] else "AP"
        return self.metrics["fp32"][key] - self.metrics["int8"][key]

    def to_json(self) -> dict[str, Any]:
        return {
            "onnx": str(self.onnx_path),
            "data_type": self.data_type,
            "image_size": list(self.metadata.image_size),
            "max_detections": self.metadata.max_detections,
            "mask_resolution": self.metadata.mask_resolution,
            "max_batch_size": self.metadata.max_batch_size,
            "static_batch_size": self.metadata.batch_size,
            "output_layout": self.metadata.output_layout,
            "input_convention": self.metadata.input_convention,
            "tensorrt_profile": {
                "min": self.profile.min,
                "opt": self.profile.opt,
                "max": self.profile.max,
            },
            "io": self.io,
            "parity": self.parity.to_json(),
            "cal_cache_file": str(self.cal_cache_file) if self.cal_cache_file else None,
            "calibration_images": self.calibration_images,
            "metrics": self.metrics,
            "mask_ap_drop": self.mask_ap_drop,
            "engine_file": str(self.engine_file) if self.engine_file else None,
            "engine_note": self.engine_note,
            "target": self.target,
            "tensorrt_plugins": self.tensorrt_plugins,
            "deepstream_files": [str(p) for p in self.deepstream_files],
            "seconds": round(self.seconds, 2),
        }


def default_output_path(model_path: Path, data_type: str) -> Path:
    """``<model stem>.<data_type>.onnx`` next to the model."""
    return model_path.with_name(f"{model_path.stem}.{data_type}.onnx")


def read_image_dir(directory: Path, image_size: tuple[int, int], limit: int) -> list[torch.Tensor]:
    """Up to ``limit`` JPEG/PNG images of ``directory``, resized and padded like inference."""
    from maskops.evaluation.images import list_images, read_image

    if not directory.is_dir():
        raise ExportError(f"--cal_image_dir {directory}: not a directory")
    paths, _ = list_images(directory)
    if not paths:
        raise ExportError(f"--cal_image_dir {directory}: no JPEG/PNG images in it")
    return [resize_and_pad(read_image(p), image_size)[0] for p in paths[:limit]]


def validation_batch(spec: ExperimentSpec, label_map: LabelMap, count: int) -> list[torch.Tensor]:
    """The first ``count`` validation images of the spec, preprocessed as for evaluation."""
    from maskops.data.pipeline import build_eval_loader

    if not spec.data_config.validation_file_pattern:
        raise ExportError(
            "data_config.validation_file_pattern is not set: export needs real images to "
            "validate the ONNX against PyTorch"
        )
    loader = build_eval_loader(spec, batch_size=count, label_map=label_map, with_masks=False)
    images: list[torch.Tensor] = []
    for batch_images, _ in loader:
        images.extend(batch_images)
        if len(images) >= count:
            break
    if not images:
        raise ExportError(
            f"data_config.validation_file_pattern {spec.data_config.validation_file_pattern!r}: "
            "no images"
        )
    return images[:count]


def training_calibration_images(
    spec: ExperimentSpec, label_map: LabelMap, *, batches: int, batch_size: int
) -> list[torch.Tensor]:
    """``batches x batch_size`` training images with the training preprocessing (TAO default)."""
    from maskops.data.pipeline import build_train_loader

    if not spec.data_config.training_file_pattern:
        raise ExportError(
            "int8 calibration needs --cal_image_dir or data_config.training_file_pattern"
        )
    loader = build_train_loader(spec, batch_size=batch_size, label_map=label_map)
    images: list[torch.Tensor] = []
    for batch_images, _ in islice(loader, batches):
        images.extend(batch_images)
    return images


def _int8_metrics(
    spec: ExperimentSpec,
    label_map: LabelMap,
    reference: torch.nn.Module,
    candidate: OnnxPredictor,
    include_mask: bool,
) -> dict[str, dict[str, float]]:
    """Validation COCO metrics of the fp32 PyTorch model and of the int8 graph."""
    from maskops.data.pipeline import build_eval_loader
    from maskops.evaluation import COCOEvaluator, evaluate_model

    if not spec.data_config.val_json_file:
        return {}
    iou_types: tuple[IouType, ...] = ("bbox", "segm") if include_mask else ("bbox",)
    metrics: dict[str, dict[str, float]] = {}
    for name, predictor in (("fp32", reference), ("int8", candidate)):
        evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map, iou_types=iou_types)
        loader = build_eval_loader(spec, label_map=label_map, with_masks=False)
        metrics[name] = evaluate_model(predictor, loader, evaluator)
    return metrics


def _atomic_save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def _batch_sizes(
    max_batch_size: int,
    static_batch_size: int | None,
    min_batch_size: int | None,
    opt_batch_size: int | None,
) -> tuple[int, BatchProfile]:
    """The export's max_batch_size and TensorRT profile, checked before any work."""
    if static_batch_size is not None:
        if static_batch_size < 1:
            raise ExportError(f"--static_batch_size must be at least 1, got {static_batch_size}")
        max_batch_size = static_batch_size
    if max_batch_size < 1:
        raise ExportError(f"--max_batch_size must be at least 1, got {max_batch_size}")
    try:
        profile = batch_profile(
            static_batch_size,
            max_batch_size=max_batch_size,
            min_batch_size=min_batch_size,
            opt_batch_size=opt_batch_size,
        )
    except EngineBuildError as exc:
        raise ExportError(str(exc)) from None
    return max_batch_size, profile


def _check_opset(opset: int, data_type: str) -> None:
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(
            f"--target_opset {opset}: maskops exports opsets {MIN_OPSET}..{MAX_OPSET}"
        )
    if data_type == "int8" and opset < INT8_MIN_OPSET:
        raise ExportError(
            f"--target_opset {opset}: int8 needs opset {INT8_MIN_OPSET} or later "
            "(per-channel QuantizeLinear)"
        )


@dataclass
class _Calibration:
    """The int8 calibration's table and where its images came from."""

    table: dict[str, dict[str, float]]
    count: int
    source: str
    symmetric: bool

    def write(self, path: Path) -> None:
        write_calibration_cache(
            path, self.table, num_images=self.count, source=self.source, symmetric=self.symmetric
        )


def _quantize(
    graph: onnx.ModelProto,
    spec: ExperimentSpec,
    label_map: LabelMap,
    metadata: GraphMetadata,
    *,
    cal_image_dir: Path | None,
    count: tuple[int, int],
    work_dir: Path,
    symmetric: bool,
    log: Callable[[str], None],
) -> tuple[onnx.ModelProto, _Calibration]:
    """The int8 QDQ graph, calibrated on ``batches x batch_size`` images (``count``) of
    ``cal_image_dir`` or of the training shards; symmetric for TensorRT."""
    batches, batch_size = count
    if cal_image_dir is not None:
        images = read_image_dir(cal_image_dir, metadata.image_size, batches * batch_size)
        source = str(cal_image_dir)
    else:
        images = training_calibration_images(
            spec, label_map, batches=batches, batch_size=batch_size
        )
        source = spec.data_config.training_file_pattern
    form = "symmetric int8 activations (TensorRT)" if symmetric else "uint8 activations"
    log(f"Calibrating int8 on {len(images)} images from {source}, {form}")
    graph, table = quantize_int8(graph, images, work_dir=work_dir, symmetric=symmetric)
    return graph, _Calibration(table, len(images), source, symmetric)


def _check_for_tensorrt(graph: onnx.ModelProto, out: Path, log: Callable[[str], None]) -> list[str]:
    """The TensorRT plugins ``graph`` needs, after checking it against TensorRT's ONNX
    import rules.

    Raises:
        ExportError: a node breaks a rule (each named with its subgraph path and the rule).
    """
    violations = check_tensorrt_graph(graph)
    if violations:
        raise ExportError(f"{out.name}: TensorRT cannot import this graph: {describe(violations)}")
    plugins = required_plugins(graph)
    log(
        "TensorRT import rules: passed"
        + (f"; plugins from TensorRT's registry: {', '.join(plugins)}" if plugins else "")
    )
    return plugins


def export_onnx(
    model_path: Path,
    spec: ExperimentSpec | None,
    out: Path | None = None,
    *,
    data_type: str = "fp32",
    max_batch_size: int = 16,
    static_batch_size: int | None = None,
    min_batch_size: int | None = None,
    opt_batch_size: int | None = None,
    cal_image_dir: Path | None = None,
    cal_cache_file: Path | None = None,
    batches: int = 10,
    batch_size: int = 8,
    engine_file: Path | None = None,
    gen_ds_config: bool = False,
    validation_images: Sequence[torch.Tensor] | None = None,
    num_validation_images: int = 4,
    tolerances: Tolerances | None = None,
    evaluate_int8: bool = True,
    log: Callable[[str], None] = print,
    opset: int = OPSET,
    workspace_bytes: int | None = None,
    strict_types: bool = False,
    output_layout: str | None = None,
    target: str = "onnxruntime",
    gpu_index: int = 0,
) -> ExportResult:
    """Export a maskops checkpoint to a validated ONNX file.

    Args:
        model_path: a maskops checkpoint (pruned or not).
        spec: the experiment spec (paths resolved): its ``image_size`` is the graph's input
            size and its data patterns supply validation/calibration images; None uses the
            checkpoint's own spec.
        out: the ``.onnx`` to write (default :func:`default_output_path`).
        data_type: "fp32", "fp16" or "int8" (QDQ).
        max_batch_size: the most images one batch may carry (the graph's batch is dynamic
            up to it; Triton's max_batch_size at publish, DeepStream's batch-size).
        static_batch_size: fix the graph's batch at this size instead (it then is the
            max_batch_size too).
        min_batch_size, opt_batch_size: the TensorRT profile's smallest and tuned batch
            (default 1 and max_batch_size; see maskops.export.tensorrt.batch_profile).
        cal_image_dir: int8 calibration images (default: the training shards).
        cal_cache_file: where to write the int8 calibration scales (default: next to out).
        batches, batch_size: int8 calibration uses ``batches * batch_size`` images.
        engine_file: build a TensorRT engine here (only where TensorRT and a GPU exist).
        gen_ds_config: write labels.txt and a DeepStream nvinfer config next to ``out``.
        validation_images: ``[3, H, W]`` images for the parity check (default: the first
            ``num_validation_images`` of the spec's validation data).
        tolerances: override the parity tolerances of ``data_type``.
        evaluate_int8: for int8, compute fp32 vs int8 validation metrics (needs val_json_file).
        log: progress lines.
        opset: the ONNX opset (TAO's ``--target_opset``), MIN_OPSET..MAX_OPSET; int8
            needs 13 or later. The parity check runs on the graph of that opset.
        workspace_bytes, strict_types: TensorRT builder settings (TAO's
            ``--max_workspace_size``, ``-s``); used only when an engine is built.
        output_layout: "maskops" or "tao" (maskops.export.tao_layout); default "tao" when
            ``engine_file`` or ``gen_ds_config`` is given, else "maskops".
        target: "onnxruntime" (portable) or "tensorrt": the graph is checked against
            TensorRT's import rules and int8 is symmetric (zero points 0). An
            ``engine_file`` implies "tensorrt".
        gpu_index: the CUDA device that builds the engine (the parity check runs on the
            CPU).

    Raises:
        ExportError: bad arguments, no images, a graph that does not match PyTorch, or
            (bound for TensorRT) a graph that breaks a TensorRT import rule.
    """
    from maskops.checkpoints.model_file import load_model

    started = time.perf_counter()
    if data_type not in DATA_TYPES:
        raise ExportError(f"--data_type {data_type!r}: expected one of {', '.join(DATA_TYPES)}")
    if target not in TARGETS:
        raise ExportError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    if gpu_index < 0:
        raise ExportError(f"--gpu_index must be at least 0, got {gpu_index}")
    max_batch_size, profile = _batch_sizes(
        max_batch_size, static_batch_size, min_batch_size, opt_batch_size
    )
    if data_type == "int8" and (batches < 1 or batch_size < 1):
        raise ExportError(f"--batches and --batch_size must be >= 1, got {batches}, {batch_size}")
    _check_opset(opset, data_type)
    try:
        layout = choose_output_layout(
            output_layout, engine=engine_file is not None, gen_ds_config=gen_ds_config
        )
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    # The TAO layout is for DeepStream, which builds a TensorRT engine from the ONNX.
    tensorrt_bound = target == "tensorrt" or engine_file is not None or layout == "tao"
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ExportError(f"-m {model_path}: model file not found")
    loaded = load_model(model_path)
    model, label_map = loaded.model.eval(), loaded.label_map
    spec = spec or loaded.spec
    image_size = tuple(spec.data_config.image_size)
    if not image_size_fits(image_size, loaded.spec.maskrcnn_config.max_level):
        stride = image_stride(loaded.spec.maskrcnn_config.max_level)
        raise ExportError(
            f"data_config.image_size {image_size}: must be multiples of 2**max_level = {stride}"
        )
    max_detections = int(model.roi_heads.detections_per_img)
    mask_resolution = int(loaded.spec.maskrcnn_config.mrcnn_resolution)
    out = Path(out) if out is not None else default_output_path(model_path, data_type)
    if out.suffix.lower() != ".onnx":
        raise ExportError(f"-o {out}: the output file must end in .onnx")
    # int8 calibration works next to the output, before anything is written there.
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = GraphMetadata(
        spec=spec,
        label_map=label_map,
        data_type=data_type,
        image_size=(int(image_size[0]), int(image_size[1])),
        max_detections=max_detections,
        mask_resolution=mask_resolution,
        max_batch_size=max_batch_size,
        batch_size=static_batch_size,
        output_layout=layout,
        input_convention=layout,  # the TAO layout takes TAO's input too (tao_layout)
    )

    images = list(validation_images or validation_batch(spec, label_map, num_validation_images))
    log(f"Tracing {model_path.name} at {image_size[0]}x{image_size[1]} ({data_type})")
    graph = trace_to_onnx(
        model,
        image_size=metadata.image_size,
        max_detections=max_detections,
        example=images[0][None],
        opset=opset,
    )
    # Input-determined shape arithmetic becomes constants (TopK's K among them).
    graph = fold_shape_arithmetic(graph)
    calibration: _Calibration | None = None
    if data_type == "fp16":
        graph = convert_to_fp16(graph)
    elif data_type == "int8":
        graph, calibration = _quantize(
            graph,
            spec,
            label_map,
            metadata,
            cal_image_dir=cal_image_dir,
            count=(batches, batch_size),
            work_dir=out.parent,
            symmetric=tensorrt_bound,
            log=log,
        )
    graph = batch_over_images(
        graph,
        row_shapes=output_row_shapes(max_detections, mask_resolution),
        static_batch_size=static_batch_size,
    )
    log(
        f"Batch: {static_batch_size} images per run (static)"
        if static_batch_size is not None
        else f"Batch: 1 to {max_batch_size} images per run (dynamic)"
    )
    if layout == "tao":
        sizes = {"max_detections": max_detections, "mask_resolution": mask_resolution}
        graph = to_tao_layout(graph, num_classes=model.num_classes, **sizes)
        log("TAO layout: Input (TAO's preprocessing), generate_detections, mask_fcn_logits")
        if problems := tao_layout_problems(graph, num_classes=model.num_classes, **sizes):
            raise ExportError(f"{out.name}: not the TAO layout: {'; '.join(problems)}")
    set_metadata(graph, metadata)
    plugins = _check_for_tensorrt(graph, out, log) if tensorrt_bound else []

    serialized = graph.SerializeToString()
    predictor = OnnxPredictor(serialized, metadata=metadata, providers=["CPUExecutionProvider"])
    reference = TorchPredictor(model)(images)
    parity = compare_detections(
        reference, predictor(images), data_type=data_type, tolerances=tolerances
    )
    log(parity.summary())
    if not parity.passed:
        raise ExportError(f"{out.name}: the ONNX does not match PyTorch: {parity.summary()}")

    metrics: dict[str, dict[str, float]] = {}
    if data_type == "int8" and evaluate_int8:
        metrics = _int8_metrics(
            spec, label_map, model, predictor, loaded.spec.maskrcnn_config.include_mask
        )
        if metrics:
            key = "mask_AP" if "mask_AP" in metrics["fp32"] else "AP"
            log(
                f"Validation {key}: fp32 {metrics['fp32'][key]:.4f}, "
                f"int8 {metrics['int8'][key]:.4f}"
            )

    _atomic_save(graph, out)
    if calibration is not None:
        cal_cache_file = cal_cache_file or out.with_suffix(".cal.json")
        calibration.write(cal_cache_file)
    result = ExportResult(
        onnx_path=out,
        data_type=data_type,
        metadata=metadata,
        profile=profile,
        parity=parity,
        io=describe_io(graph),
        report_path=out.with_suffix(".export.json"),
        cal_cache_file=cal_cache_file if calibration is not None else None,
        calibration_images=calibration.count if calibration is not None else 0,
        metrics=metrics,
        target="tensorrt" if tensorrt_bound else "onnxruntime",
        tensorrt_plugins=plugins,
    )
    engine_target = engine_file or out.with_suffix(".engine")
    reason = tensorrt_unavailable_reason()
    if engine_file is None:
        result.engine_note = "no --engine_file given: no TensorRT engine requested"
    elif reason is None:
        builder: dict[str, Any] = {"strict_types": strict_types}
        if workspace_bytes is not None:
            builder["workspace_bytes"] = workspace_bytes
        result.engine_file = build_engine(
            out,
            engine_file,
            data_type=data_type,
            image_size=metadata.image_size,
            profile=profile,
            gpu_index=gpu_index,
            **builder,
        )
        result.engine_note = f"TensorRT engine built: {result.engine_file}"
    else:
        result.engine_note = ENGINE_ELSEWHERE.format(reason=reason)
    log(result.engine_note)
    if gen_ds_config:
        result.deepstream_files = write_deepstream_files(
            out.parent,
            onnx_path=out,
            engine_path=engine_target,
            label_map=label_map,
            num_classes=model.num_classes,
            data_type=data_type,
            image_size=metadata.image_size,
            mask_resolution=mask_resolution,
            max_batch_size=max_batch_size,
            max_detections=max_detections,
        )
    result.seconds = time.perf_counter() - started
    result.report_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    log(f"Exported {out} ({out.stat().st_size / 1e6:.1f} MB) in {result.seconds:.1f} s")
    return result
