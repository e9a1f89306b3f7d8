# ruff: noqa: RUF009 - option() is dataclasses.field with the declared metadata
"""What ``maskops gen_trt_engine`` builds: the declaration of its options (tao-deploy's
``mask_rcnn gen_trt_engine`` flags).

:class:`GenTrtEngineOptions`' fields are the subcommand's flags besides the files it reads
and writes' folder (``-m``, ``-r``, ``-e``), built from them (:mod:`maskops.options_schema`);
no job runs it (the engine must be built by the TensorRT of the Triton that serves it, on
its host), so none has a REST name. Standard library only, as every task declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from maskops.export.options import DataType
from maskops.options_schema import option

CALIBRATION_FLAG_HELP = "accepted; calibrate at export"
"""tao-deploy's calibration flags change nothing here (the int8 scales are the QDQ ONNX's);
each prints why when given."""
DEFAULT_WORKSPACE_GB = 2.0
"""TensorRT's builder workspace unless given, in GB (as tao-deploy)."""
DEFAULT_CALIBRATION_BATCHES = 10
DEFAULT_CALIBRATION_BATCH_SIZE = 1


@dataclass(frozen=True)
class GenTrtEngineOptions:
    """The engine build's options (declared: :mod:`maskops.options_schema`)."""

    engine_file: Path | None = option(
        None, help="engine to write (default: RESULTS_DIR/<model name>.<data_type>.engine)"
    )
    data_type: DataType = option("fp32", help="fp32, fp16 or int8 (from the QDQ ONNX)")
    max_workspace_size: float = option(
        DEFAULT_WORKSPACE_GB, help="TensorRT builder workspace in GB (default 2, as tao-deploy)"
    )
    strict_type_constraints: bool = option(
        False,
        help="TensorRT obeys the layer precisions instead of picking faster ones",
        flag=("-s", "--strict_type_constraints"),
    )
    min_batch_size: int | None = option(
        None, help="smallest batch of the engine's profile (default 1)"
    )
    opt_batch_size: int | None = option(
        None, help="batch TensorRT tunes for (default --max_batch_size)"
    )
    max_batch_size: int | None = option(
        None,
        help="largest batch of the engine's profile (default: the export's --max_batch_size); "
        "a static-batch ONNX takes only its own batch",
    )
    batch_size: int = option(DEFAULT_CALIBRATION_BATCH_SIZE, help=CALIBRATION_FLAG_HELP)
    batches: int = option(DEFAULT_CALIBRATION_BATCHES, help=CALIBRATION_FLAG_HELP)
    cal_image_dir: str | None = option(None, help=CALIBRATION_FLAG_HELP)
    cal_data_file: str | None = option(None, help=CALIBRATION_FLAG_HELP)
    cal_cache_file: str | None = option(None, help=CALIBRATION_FLAG_HELP)
    verbose: bool = option(False, help="TensorRT's verbose log", flag=("-v", "--verbose"))
    gpu_index: int = option(0, help="CUDA device that builds the engine (default 0)")
