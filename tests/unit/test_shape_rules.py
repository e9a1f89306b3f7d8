"""The size rules every door calls: the spec, the model builder, the exporter, TensorRT and
the export job's options refuse the same sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from maskops.export.tensorrt import EngineBuildError, batch_profile
from maskops.shape_rules import batch_order_error, image_size_fits, image_stride
from maskops.spec.models import ExperimentSpec
from maskops_core.options import ExportOptions


@pytest.mark.parametrize(
    ("size", "max_level", "fits"),
    [
        ((832, 1344), 6, True),
        ((832, 1000), 6, False),
        ((832, 1344), 7, False),
        ((256, 512), 6, True),
    ],
)
def test_image_sizes_the_spec_accepts_are_the_rule_s(
    size: tuple[int, int], max_level: int, fits: bool
) -> None:
    assert image_size_fits(size, max_level) is fits
    assert image_stride(max_level) == 2**max_level
    data = {
        "data_config": {"image_size": f"({size[0]}, {size[1]})"},
        "maskrcnn_config": {"max_level": max_level},
    }
    if fits:
        ExperimentSpec.model_validate(data)
    else:
        with pytest.raises(ValidationError, match=f"2\\^max_level = {2**max_level}"):
            ExperimentSpec.model_validate(data)


@pytest.mark.parametrize(
    ("low", "opt", "high"), [(1, 4, 4), (2, 2, 8), (3, 2, 8), (1, 9, 8), (5, 5, 4)]
)
def test_the_engine_and_the_job_options_order_batches_alike(low: int, opt: int, high: int) -> None:
    error = batch_order_error(low, opt, high)
    assert (error is None) is (low <= opt <= high)
    sizes = {"min_batch_size": low, "opt_batch_size": opt, "max_batch_size": high}
    if error is None:
        batch_profile(None, **sizes)
        ExportOptions.model_validate(sizes)
        return
    with pytest.raises(EngineBuildError, match="min <= opt <= max"):
        batch_profile(None, **sizes)
    with pytest.raises(ValidationError, match="min <= opt <= max"):
        ExportOptions.model_validate(sizes)
