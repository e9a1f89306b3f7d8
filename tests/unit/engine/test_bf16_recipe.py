"""use_amp on a CPU with native bf16 kernels: as accurate as fp32, not just faster.

The speed is bench/bench_train.py's business; this checks that bf16 autocast (with fp32
master weights, see maskops.engine.trainer.AmpSettings) trains the trained fixture's model
to the same quality. Only where oneDNN runs bf16 natively (AVX-512 BF16 / AMX): elsewhere
use_amp is declined on the CPU and there is nothing to compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maskops.engine import run_training
from maskops.engine.trainer import cpu_has_native_bf16

TOLERANCE = 0.05
"""Mask AP points (absolute) bf16 may fall short of fp32: two trainings of this size from
one seed, with different rounding, land within about 0.03 of each other."""


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="no native bf16 kernels on this CPU")
def test_bf16_autocast_trains_to_the_fp32_mask_ap(
    trained_model: Any,  # tests/conftest.py's TrainedModel
    tmp_path: Path,
) -> None:
    spec = trained_model.spec.model_copy(update={"use_amp": True})
    result = run_training(spec, tmp_path / "bf16")
    mask_ap = float(result.metrics["mask_AP"])
    assert mask_ap >= trained_model.mask_ap - TOLERANCE, (
        f"bf16 mask AP {mask_ap:.3f} vs fp32 {trained_model.mask_ap:.3f}"
    )
