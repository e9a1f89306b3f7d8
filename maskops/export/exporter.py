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
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

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
    GraphMetadata,
    describe_io,
    output_row_shapes,
    set_metadata,
    trace_to_onnx,
)
from maskops.export.options import (
    DATA_TYPES,
    TARGETS,
    ExportOptions,
    export_file_name,
    opset_error,
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
from maskops.modeling import SpecMaskRCNN
from maskops.progress import shown, stage
from maskops.shape_rules import image_size_fits, image_stride
from maskops.spec.models import ExperimentSpec


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
    """:func:`~maskops.export.options.export_file_name` next to the model."""
    return model_path.with_name(export_file_name(model_path, data_type))


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
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """Validation COCO metrics of the fp32 PyTorch model and of the int8 graph (with
    ``progress``, an ``evaluate fp32`` and an ``evaluate int8`` bar)."""
    from maskops.data.pipeline import build_eval_loader
    from maskops.evaluation import COCOEvaluator, evaluate_model

    if not spec.data_config.val_json_file:
        return {}
    iou_types: tuple[IouType, ...] = ("bbox", "segm") if include_mask else ("bbox",)
    # The loader already stops at eval_samples: as max_images it gives the bar its total.
    total = spec.data_config.eval_samples or None
    metrics: dict[str, dict[str, float]] = {}
    for name, predictor in (("fp32", reference), ("int8", candidate)):
        evaluator = COCOEvaluator(spec.data_config.val_json_file, label_map, iou_types=iou_types)
        loader = build_eval_loader(spec, label_map=label_map, with_masks=False)
        metrics[name] = evaluate_model(
            predictor,
            loader,
            evaluator,
            max_images=total,
            progress=progress,
            desc=f"evaluate {name}",
        )
    return metrics


def _atomic_save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def _batch_sizes(options: ExportOptions) -> tuple[int, BatchProfile]:
    """The export's max_batch_size and TensorRT profile, checked before any work."""
    max_batch_size, static_batch_size = options.max_batch_size, options.static_batch_size
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
            min_batch_size=options.min_batch_size,
            opt_batch_size=options.opt_batch_size,
        )
    except EngineBuildError as exc:
        raise ExportError(str(exc)) from None
    return max_batch_size, profile


def _check_opset(opset: int, data_type: str) -> None:
    error = opset_error(opset, data_type)
    if error is not None:
        raise ExportError(f"--target_opset {opset}: {error}")


def _checked_options(options: ExportOptions) -> tuple[int, BatchProfile, str]:
    """The max_batch_size, TensorRT profile and output layout ``options`` make, after
    checking every option that needs no file (in the order the flags are documented).

    Raises:
        ExportError: an option out of range or contradicting another.
    """
    if options.data_type not in DATA_TYPES:
        raise ExportError(
            f"--data_type {options.data_type!r}: expected one of {', '.join(DATA_TYPES)}"
        )
    if options.target not in TARGETS:
        raise ExportError(f"--target {options.target!r}: expected one of {', '.join(TARGETS)}")
    if options.gpu_index < 0:
        raise ExportError(f"--gpu_index must be at least 0, got {options.gpu_index}")
    max_batch_size, profile = _batch_sizes(options)
    if options.data_type == "int8" and (options.batches < 1 or options.batch_size < 1):
        raise ExportError(
            f"--batches and --batch_size must be >= 1, got {options.batches}, {options.batch_size}"
        )
    _check_opset(options.opset, options.data_type)
    try:
        layout = choose_output_layout(
            options.output_layout,
            engine=options.engine_file is not None,
            gen_ds_config=options.gen_ds_config,
        )
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return max_batch_size, profile, layout


@dataclass
class _Export:
    """One export's inputs, checked: the options, the model and what the graph will be."""

    options: ExportOptions
    model_path: Path
    out: Path
    model: SpecMaskRCNN
    spec: ExperimentSpec
    """The spec the export runs with (data patterns, image size)."""
    stored_spec: ExperimentSpec
    """The checkpoint's own spec (its architecture)."""
    metadata: GraphMetadata
    profile: BatchProfile
    progress: bool = False
    """Show each counted stage's progress: a bar on a terminal, plain lines elsewhere."""

    @property
    def label_map(self) -> LabelMap:
        return self.metadata.label_map

    @property
    def tensorrt_bound(self) -> bool:
        # The TAO layout is for DeepStream, which builds a TensorRT engine from the ONNX.
        return (
            self.options.target == "tensorrt"
            or self.options.engine_file is not None
            or self.metadata.output_layout == "tao"
        )


def _prepare(
    model_path: Path, spec: ExperimentSpec | None, out: Path | None, options: ExportOptions
) -> _Export:
    """Check the options, load the model and describe the graph, before any work is done.

    Raises:
        ExportError: a bad option, a missing model file, an image size the model cannot
            take, or an output that is not an ``.onnx``.
    """
    from maskops.checkpoints.model_file import load_model

    max_batch_size, profile, layout = _checked_options(options)
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ExportError(f"-m {model_path}: model file not found")
    loaded = load_model(model_path)
    spec = spec or loaded.spec
    image_size = tuple(spec.data_config.image_size)
    if not image_size_fits(image_size, loaded.spec.maskrcnn_config.max_level):
        stride = image_stride(loaded.spec.maskrcnn_config.max_level)
        raise ExportError(
            f"data_config.image_size {image_size}: must be multiples of 2**max_level = {stride}"
        )
    out = Path(out) if out is not None else default_output_path(model_path, options.data_type)
    if out.suffix.lower() != ".onnx":
        raise ExportError(f"-o {out}: the output file must end in .onnx")
    # int8 calibration works next to the output, before anything is written there.
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = GraphMetadata(
        spec=spec,
        label_map=loaded.label_map,
        data_type=options.data_type,
        image_size=(int(image_size[0]), int(image_size[1])),
        max_detections=int(loaded.model.roi_heads.detections_per_img),
        mask_resolution=int(loaded.spec.maskrcnn_config.mrcnn_resolution),
        max_batch_size=max_batch_size,
        batch_size=options.static_batch_size,
        output_layout=layout,
        input_convention=layout,  # the TAO layout takes TAO's input too (tao_layout)
    )
    model = loaded.model.eval()
    return _Export(options, model_path, out, model, spec, loaded.spec, metadata, profile)


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
    job: _Export, graph: onnx.ModelProto, log: Callable[[str], None]
) -> tuple[onnx.ModelProto, _Calibration]:
    """The int8 QDQ graph, calibrated on ``--batches x --batch_size`` images of
    ``--cal_image_dir`` or of the training shards (a ``calibrate`` bar over them);
    symmetric for TensorRT."""
    options, spec, symmetric = job.options, job.spec, job.tensorrt_bound
    batches, batch_size = options.batches, options.batch_size
    if options.cal_image_dir is not None:
        images = read_image_dir(
            options.cal_image_dir, job.metadata.image_size, batches * batch_size
        )
        source = str(options.cal_image_dir)
    else:
        images = training_calibration_images(
            spec, job.label_map, batches=batches, batch_size=batch_size
        )
        source = spec.data_config.training_file_pattern
    form = "symmetric int8 activations (TensorRT)" if symmetric else "uint8 activations"
    line = f"Calibrating int8 on {len(images)} images from {source}, {form}"
    with stage(
        log, line, total=len(images), desc="calibrate", unit="img", enabled=shown(job.progress)
    ) as bar:
        graph, table = quantize_int8(
            graph, images, work_dir=job.out.parent, symmetric=symmetric, progress=bar
        )
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


def _trace(job: _Export, example: torch.Tensor, log: Callable[[str], None]) -> onnx.ModelProto:
    """The fp32 graph of one image, its input-determined shape arithmetic folded."""
    meta = job.metadata
    line = (
        f"Tracing {job.model_path.name} at {meta.image_size[0]}x{meta.image_size[1]} "
        f"({meta.data_type})"
    )
    with stage(log, line):
        graph = trace_to_onnx(
            job.model,
            image_size=meta.image_size,
            max_detections=meta.max_detections,
            example=example[None],
            opset=job.options.opset,
        )
    # Input-determined shape arithmetic becomes constants (TopK's K among them).
    return fold_shape_arithmetic(graph)


def _to_precision(
    job: _Export, graph: onnx.ModelProto, log: Callable[[str], None]
) -> tuple[onnx.ModelProto, _Calibration | None]:
    """The graph in the export's data type: fp32 as is, fp16 converted, int8 calibrated."""
    options = job.options
    if options.data_type == "fp16":
        return convert_to_fp16(graph), None
    if options.data_type != "int8":
        return graph, None
    return _quantize(job, graph, log)


def _batched(job: _Export, graph: onnx.ModelProto, log: Callable[[str], None]) -> onnx.ModelProto:
    """The one-image graph run over a batch (static or dynamic)."""
    meta = job.metadata
    graph = batch_over_images(
        graph,
        row_shapes=output_row_shapes(meta.max_detections, meta.mask_resolution),
        static_batch_size=meta.batch_size,
    )
    if meta.batch_size is not None:
        log(f"Batch: {meta.batch_size} images per run (static: one graph copy per image)")
    else:
        log(f"Batch: 1 to {meta.max_batch_size} images per run (dynamic: a Loop over images)")
    return graph


def _in_tao_layout(
    job: _Export, graph: onnx.ModelProto, log: Callable[[str], None]
) -> onnx.ModelProto:
    """The graph with TAO's input and outputs (DeepStream's), checked to be that layout."""
    sizes = {
        "max_detections": job.metadata.max_detections,
        "mask_resolution": job.metadata.mask_resolution,
    }
    graph = to_tao_layout(graph, num_classes=job.model.num_classes, **sizes)
    log("TAO layout: Input (TAO's preprocessing), generate_detections, mask_fcn_logits")
    if problems := tao_layout_problems(graph, num_classes=job.model.num_classes, **sizes):
        raise ExportError(f"{job.out.name}: not the TAO layout: {'; '.join(problems)}")
    return graph


def _build_graph(
    job: _Export, example: torch.Tensor, log: Callable[[str], None]
) -> tuple[onnx.ModelProto, _Calibration | None, list[str]]:
    """The finished graph, its int8 calibration (None unless int8) and the TensorRT plugins
    it needs (TensorRT-bound exports only, after checking TensorRT's import rules)."""
    graph, calibration = _to_precision(job, _trace(job, example, log), log)
    graph = _batched(job, graph, log)
    if job.metadata.output_layout == "tao":
        graph = _in_tao_layout(job, graph, log)
    set_metadata(graph, job.metadata)
    plugins = _check_for_tensorrt(graph, job.out, log) if job.tensorrt_bound else []
    return graph, calibration, plugins


def _matching_pytorch(
    job: _Export,
    graph: onnx.ModelProto,
    images: list[torch.Tensor],
    tolerances: Tolerances | None,
    log: Callable[[str], None],
) -> tuple[ParityReport, OnnxPredictor]:
    """The graph's detections compared with PyTorch's on ``images`` (onnxruntime, CPU), a
    ``parity`` bar counting the images; both run the graph's batch size at a time, so a
    dynamic graph's Loop over images is checked on several.

    Raises:
        ExportError: they differ beyond the data type's tolerances.
    """
    predictor = OnnxPredictor(
        graph.SerializeToString(), metadata=job.metadata, providers=["CPUExecutionProvider"]
    )
    torch_predictor = TorchPredictor(job.model)
    reference: list[dict[str, torch.Tensor]] = []
    candidate: list[dict[str, torch.Tensor]] = []
    line = f"Checking the ONNX against PyTorch on {len(images)} validation images"
    enabled = shown(job.progress)
    with stage(log, line, total=len(images), desc="parity", unit="img", enabled=enabled) as bar:
        for start in range(0, len(images), predictor.batch_size):
            chunk = images[start : start + predictor.batch_size]
            reference.extend(torch_predictor(chunk))
            candidate.extend(predictor(chunk))
            bar.update(len(chunk))
    parity = compare_detections(
        reference, candidate, data_type=job.options.data_type, tolerances=tolerances
    )
    log(parity.summary())
    if not parity.passed:
        raise ExportError(f"{job.out.name}: the ONNX does not match PyTorch: {parity.summary()}")
    return parity, predictor


def _logged_int8_metrics(
    job: _Export, predictor: OnnxPredictor, log: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """Validation COCO metrics of the fp32 model and the int8 graph, the AP logged."""
    include_mask = job.stored_spec.maskrcnn_config.include_mask
    metrics = _int8_metrics(
        job.spec, job.label_map, job.model, predictor, include_mask, progress=job.progress
    )
    if metrics:
        key = "mask_AP" if "mask_AP" in metrics["fp32"] else "AP"
        log(f"Validation {key}: fp32 {metrics['fp32'][key]:.4f}, int8 {metrics['int8'][key]:.4f}")
    return metrics


def _engine(job: _Export, result: ExportResult, log: Callable[[str], None]) -> None:
    """Build the TensorRT engine where one was requested and TensorRT is here (a bar per
    phase of the build that TensorRT reports); the note says what happened."""
    options, reason = job.options, tensorrt_unavailable_reason()
    if options.engine_file is None:
        result.engine_note = "no --engine_file given: no TensorRT engine requested"
    elif reason is None:
        builder: dict[str, Any] = {"strict_types": options.strict_types}
        if options.workspace_bytes is not None:
            builder["workspace_bytes"] = options.workspace_bytes
        with stage(log, f"Building the TensorRT engine {options.engine_file}"):
            result.engine_file = build_engine(
                job.out,
                options.engine_file,
                data_type=options.data_type,
                image_size=job.metadata.image_size,
                profile=job.profile,
                gpu_index=options.gpu_index,
                progress=job.progress,
                **builder,
            )
        result.engine_note = f"TensorRT engine built: {result.engine_file}"
    else:
        result.engine_note = ENGINE_ELSEWHERE.format(reason=reason)


def _deepstream(job: _Export) -> list[Path]:
    """labels.txt and the nvinfer config next to the ONNX (``gen_ds_config``)."""
    meta = job.metadata
    return write_deepstream_files(
        job.out.parent,
        onnx_path=job.out,
        engine_path=job.options.engine_file or job.out.with_suffix(".engine"),
        label_map=meta.label_map,
        num_classes=job.model.num_classes,
        data_type=meta.data_type,
        image_size=meta.image_size,
        mask_resolution=meta.mask_resolution,
        max_batch_size=meta.max_batch_size,
        max_detections=meta.max_detections,
    )


def _write(
    job: _Export,
    graph: onnx.ModelProto,
    calibration: _Calibration | None,
    parity: ParityReport,
    log: Callable[[str], None],
) -> ExportResult:
    """Write the ONNX (and the int8 calibration scales); the result describing them."""
    with stage(log, f"Writing {job.out}"):
        _atomic_save(graph, job.out)
    cal_cache_file = None
    if calibration is not None:
        cal_cache_file = job.options.cal_cache_file or job.out.with_suffix(".cal.json")
        calibration.write(cal_cache_file)
    return ExportResult(
        onnx_path=job.out,
        data_type=job.options.data_type,
        metadata=job.metadata,
        profile=job.profile,
        parity=parity,
        io=describe_io(graph),
        report_path=job.out.with_suffix(".export.json"),
        cal_cache_file=cal_cache_file,
        calibration_images=calibration.count if calibration is not None else 0,
        target="tensorrt" if job.tensorrt_bound else "onnxruntime",
    )


def export_onnx(
    model_path: Path,
    spec: ExperimentSpec | None,
    out: Path | None = None,
    options: ExportOptions | None = None,
    *,
    validation_images: Sequence[torch.Tensor] | None = None,
    num_validation_images: int = 4,
    tolerances: Tolerances | None = None,
    evaluate_int8: bool = True,
    log: Callable[[str], None] = print,
    progress: bool = False,
    **option_values: Any,
) -> ExportResult:
    """Export a maskops checkpoint to a validated ONNX file.

    Args:
        model_path: a maskops checkpoint (pruned or not).
        spec: the experiment spec (paths resolved): its ``image_size`` is the graph's input
            size and its data patterns supply validation/calibration images; None uses the
            checkpoint's own spec.
        out: the ``.onnx`` to write (default :func:`default_output_path`).
        options: what to make (:class:`~maskops.export.options.ExportOptions`);
            ``option_values`` (its field names) override single options.
        validation_images: ``[3, H, W]`` images for the parity check (default: the first
            ``num_validation_images`` of the spec's validation data).
        tolerances: override the parity tolerances of the data type.
        evaluate_int8: for int8, compute fp32 vs int8 validation metrics (needs val_json_file).
        log: a line as each stage starts, and the results.
        progress: show the progress of the stages that have a count (calibration images,
            parity images, int8 evaluation, TensorRT's build phases): a bar on a terminal,
            plain lines elsewhere (:mod:`maskops.progress`).

    Raises:
        ExportError: bad options, no images, a graph that does not match PyTorch, or
            (bound for TensorRT) a graph that breaks a TensorRT import rule.
    """
    started = time.perf_counter()
    options = replace(options or ExportOptions(), **option_values)
    job = replace(_prepare(model_path, spec, out, options), progress=progress)
    images = list(
        validation_images or validation_batch(job.spec, job.label_map, num_validation_images)
    )
    graph, calibration, plugins = _build_graph(job, images[0], log)
    parity, predictor = _matching_pytorch(job, graph, images, tolerances, log)
    metrics = {}
    if options.data_type == "int8" and evaluate_int8:
        metrics = _logged_int8_metrics(job, predictor, log)
    result = _write(job, graph, calibration, parity, log)
    result.metrics, result.tensorrt_plugins = metrics, plugins
    _engine(job, result, log)
    log(result.engine_note)
    if options.gen_ds_config:
        result.deepstream_files = _deepstream(job)
    result.seconds = time.perf_counter() - started
    result.report_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    log(f"Exported {job.out} ({job.out.stat().st_size / 1e6:.1f} MB) in {result.seconds:.1f} s")
    return result
