"""``maskops prune`` as an engine function: load a checkpoint, prune it, save model + report."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from maskops.checkpoints.model_file import CheckpointError, load_model, save_checkpoint
from maskops.prune.options import PruneOptions
from maskops.prune.pruner import PruneError, prune_model
from maskops.prune.report import PruneReport
from maskops.spec.models import MaskRCNNConfig

MODEL_FILENAME = "model.pth"
REPORT_FILENAME = "prune_report.json"

TRACE_SIZE = 128
"""Side of the square zero image used to trace the backbone (sizes do not affect tracing)."""


def trace_input(config: MaskRCNNConfig) -> torch.Tensor:
    """The zero image batch ``[1, 3, S, S]`` that a model of ``config`` is traced with."""
    # The backbone needs at least one pixel at its coarsest level.
    side = max(TRACE_SIZE, 2**config.max_level)
    return torch.zeros(1, 3, side, side)


def run_prune(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: PruneOptions | None = None,
    *,
    model_filename: str = MODEL_FILENAME,
    **option_values: Any,
) -> PruneReport:
    """Prune the maskops checkpoint ``model_path`` into ``out_dir``.

    Writes ``out_dir/<model_filename>`` (a maskops checkpoint of the pruned architecture,
    step 0, with the source's spec and label map, so that a spec's ``pruned_model_path``
    rebuilds it without the original) and ``out_dir/prune_report.json``. MACs are counted
    at the stored spec's ``data_config.image_size``. ``options``
    (:class:`~maskops.prune.options.PruneOptions`) are those of
    :func:`maskops.prune.prune_model`; ``option_values`` (its field names) override single
    options.

    Retraining: put the written file in a spec's ``pruned_model_path`` (``checkpoint`` then
    only adds weights whose shapes match). As TAO advises for retraining a pruned model,
    turn the regularisers off there (``l1_weight_decay: 0``, ``l2_weight_decay: 0``): they
    would keep shrinking the filters that pruning judged important.

    Raises:
        PruneError: bad options, or a file that is not a usable maskops checkpoint.
    """
    options = replace(options or PruneOptions(), **option_values)
    source = Path(model_path)
    try:
        loaded = load_model(source, map_location="cpu")
    except CheckpointError as exc:
        raise PruneError(str(exc)) from exc
    report = prune_model(
        loaded.model,
        example_inputs=trace_input(loaded.spec.maskrcnn_config),
        norm=options.norm,
        equalization=options.equalization,
        granularity=options.granularity,
        threshold=options.threshold,
        min_filters=options.min_filters,
        excluded_layers=options.excluded_layers,
        macs_image_size=loaded.spec.data_config.image_size,
    )
    out = Path(out_dir)
    model_file = save_checkpoint(
        out / model_filename,
        model=loaded.model,
        spec=loaded.spec,
        label_map=loaded.label_map,
        step=0,
    )
    report.source_model = str(source)
    report.output_model = str(model_file)
    (out / REPORT_FILENAME).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report
