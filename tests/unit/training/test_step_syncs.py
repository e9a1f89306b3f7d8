"""Host synchronisations per training step on a CUDA GPU, counted by torch's sync debug mode.

Without a loss scaler (bf16, fp32) the trainer checked that the loss was finite at every
micro-batch, a ``bool(tensor)`` that waits for the GPU; it now checks at logging steps
(``Trainer.finite_check_period``). The model's normalisation constants are made once per
device instead of copied to the GPU each step, the FPN poolers read the RoIs' level counts
once instead of waiting once per level, and the mask targets no longer pick each image's
matched ground truths with ``torch.unique``. Matching, sampling and proposal filtering
run in fixed shapes (:mod:`maskops.modeling.sampling`). The counts are printed for the
record; tests/unit/training/test_host_reads.py holds the calls that wait, counted on a CPU.
"""

from __future__ import annotations

import statistics
import warnings

import pytest
import torch

from maskops.data.pipeline import build_train_loader
from maskops.spec.models import ExperimentSpec
from maskops.training.optim import build_optimizer
from maskops.training.seeding import seed_everything
from maskops.training.train import build_training_model
from maskops.training.trainer import AmpSettings, HookBase, Trainer

pytestmark = pytest.mark.gpu


SYNC_WARNING = "called a synchronizing CUDA operation"
"""What torch's sync debug mode says; other warnings of a step (the data's) are not syncs."""


class SyncsPerStep(HookBase):
    """Synchronising calls warned about between one step's start and its end."""

    def __init__(self, caught: list[warnings.WarningMessage]) -> None:
        self.caught = caught
        self.start = 0
        self.counts: list[int] = []

    def before_step(self) -> None:
        self.start = len(self.caught)

    def after_step(self) -> None:
        step = self.caught[self.start :]
        self.counts.append(sum(SYNC_WARNING in str(w.message) for w in step))


def _syncs_per_step(spec: ExperimentSpec, period: int) -> list[int]:
    device = torch.device("cuda")
    seed_everything(spec.seed)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes).to(device)
    trainer = Trainer(
        model=model,
        optimizer=build_optimizer(model, lr=0.004, momentum=0.9, l2_weight_decay=1e-4),
        data=iter(build_train_loader(spec)),
        schedule=lambda step: 0.004,
        max_steps=6,
        device=device,
        amp=AmpSettings.for_device(device, enabled=True),
        finite_check_period=period,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counter = SyncsPerStep(caught)
        trainer.register_hooks([counter])
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return counter.counts


def test_a_bf16_step_waits_for_the_gpu_once_less_than_it_did(tiny_spec: ExperimentSpec) -> None:
    if AmpSettings.for_device(torch.device("cuda"), enabled=True).dtype != torch.bfloat16:
        pytest.skip("no native bf16 on this GPU: fp16 runs with a loss scaler")
    every_step = _syncs_per_step(tiny_spec, period=1)
    deferred = _syncs_per_step(tiny_spec, period=6)  # checked only after the last step
    print(f"host syncs per step: checked every step {every_step}, deferred {deferred}")
    assert statistics.median(deferred[:-1]) <= statistics.median(every_step[:-1]) - 1


def test_a_bf16_step_waits_a_few_times_whatever_the_batch(tiny_spec: ExperimentSpec) -> None:
    """On a CPU the step makes 4 calls that wait, plus an NMS per image; on a GPU the NMS
    keeps its result on the device. An H200 counted 9 per step at batch 2 and at batch 4
    (2026-11-28, bench/results/sync_sites_cuda.json), 5 of them since removed (the box
    coding's copies of its constants, the target-box check's own read): the count holds
    at most that and does not grow with the batch."""
    if AmpSettings.for_device(torch.device("cuda"), enabled=True).dtype != torch.bfloat16:
        pytest.skip("no native bf16 on this GPU: fp16 runs with a loss scaler")
    counts = {
        batch: _syncs_per_step(tiny_spec.model_copy(update={"train_batch_size": batch}), 6)[1:-1]
        for batch in (2, 4)
    }
    print(f"host syncs per step by batch: {counts}")
    assert max(max(per_step) for per_step in counts.values()) <= 9
    assert statistics.median(counts[4]) == statistics.median(counts[2])
