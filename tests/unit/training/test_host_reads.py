"""The calls that would make the host wait for a GPU, counted on the CPU: the counter, and
how many a training step makes (held here; tests/unit/training/test_step_syncs.py counts
the real waits on a GPU)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.ops import nms

from maskops.data.pipeline import build_train_loader
from maskops.spec.models import ExperimentSpec
from maskops.training.host_reads import HostReadCounter
from maskops.training.optim import build_optimizer
from maskops.training.seeding import seed_everything
from maskops.training.train import build_training_model
from maskops.training.trainer import AmpSettings, HookBase, Trainer

VALUES = torch.tensor([0.2, 0.9, 0.4, 0.7])
MASK = VALUES > 0.5
BOXES = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]])


@pytest.mark.parametrize(
    "call",
    [
        lambda: VALUES[MASK],
        lambda: VALUES.clone().__setitem__(MASK, 0.0),
        lambda: torch.where(MASK),
        lambda: VALUES.nonzero(),
        lambda: VALUES[0].item(),
        lambda: bool(VALUES.sum() > 1),
        lambda: VALUES.tolist(),
        lambda: torch.unique(MASK),
        lambda: torch.bincount(MASK.long()),
        lambda: VALUES.masked_select(MASK),
        lambda: nms(BOXES, VALUES[:3], 0.5),
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
    ],
)
def test_each_call_that_reads_the_device_counts_once(call: Callable[[], Any]) -> None:
    with HostReadCounter() as reads:
        call()
    assert reads.total == 1, reads.by_call


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.tensor(0.5, dtype=VALUES.dtype, device=VALUES.device),
        lambda: torch.as_tensor((1.0, 1.0), dtype=VALUES.dtype, device=VALUES.device),
        lambda: VALUES.new_tensor([1.0, 2.0]),
        lambda: torch.from_numpy(np.ones(2)),
        lambda: VALUES.to("meta"),  # a copy to a device: to a GPU, the host waits for it
        lambda: torch.empty(4, device="meta").copy_(VALUES),
    ],
)
def test_each_tensor_made_from_host_data_counts_once(call: Callable[[], Any]) -> None:
    with HostReadCounter() as reads:
        call()
    assert reads.from_host == 1, reads.from_host_by_call
    assert reads.total == 0, reads.by_call


def test_python_scalars_and_device_side_factories_copy_nothing() -> None:
    """A Python scalar operand goes to the kernel as an argument (``torch.where``'s a CPU
    scalar tensor, which a GPU kernel takes as one too); ``full``/``arange``/``zeros``
    fill on the device; a ``non_blocking`` copy (from pinned memory) does not wait."""
    with HostReadCounter() as reads:
        VALUES * 0.5
        torch.where(MASK, VALUES, -1.0)
        VALUES.clamp(max=0.5)
        torch.full((2,), 3.0, device=VALUES.device)
        torch.arange(3, device=VALUES.device)
        VALUES.new_zeros(3)
        VALUES.to(torch.bfloat16)
        VALUES.to("meta", non_blocking=True)
    assert reads.from_host == 0, reads.from_host_by_call


def test_fixed_shape_work_reads_nothing() -> None:
    with HostReadCounter() as reads:
        keys, index = torch.where(MASK, VALUES, -1.0).topk(2)
        torch.zeros(4, dtype=torch.bool).scatter(0, index, keys >= 0)
        VALUES[torch.tensor([0, 2])] * 2
        torch.argsort(MASK.to(torch.uint8), descending=True, stable=True)
        torch.repeat_interleave(torch.tensor([1, 2]), torch.tensor([2, 1]), output_size=3)
    assert reads.total == 0, reads.by_call


class ReadsPerStep(HookBase):
    def __init__(self) -> None:
        self.steps: list[HostReadCounter] = []
        self.counter = HostReadCounter()

    def before_step(self) -> None:
        self.counter = HostReadCounter().__enter__()

    def after_step(self) -> None:
        self.counter.__exit__(None, None, None)
        self.steps.append(self.counter)


def _reads_per_step(spec: ExperimentSpec, steps: int) -> list[Counter[str]]:
    return [counter.by_call for counter in _counted_steps(spec, steps)]


def _counted_steps(spec: ExperimentSpec, steps: int) -> list[HostReadCounter]:
    seed_everything(spec.seed)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes)
    batches = list(itertools.islice(iter(build_train_loader(spec)), steps))  # loaded before
    trainer = Trainer(
        model=model,
        optimizer=build_optimizer(model, lr=0.004, momentum=0.9, l2_weight_decay=1e-4),
        data=iter(batches),
        schedule=lambda step: 0.004,
        max_steps=steps,
        device=torch.device("cpu"),
        amp=AmpSettings.for_device(torch.device("cpu"), enabled=False),
        finite_check_period=steps + 1,  # checked after the last step, outside the count
    )
    counter = ReadsPerStep()
    trainer.register_hooks([counter])
    trainer.train()
    return counter.steps[1:-1]  # the first step makes the anchors and constants once


@pytest.mark.parametrize("batch", [1, 3])
def test_a_training_step_reads_the_device_four_times_and_once_per_image(
    tiny_spec: ExperimentSpec, batch: int
) -> None:
    """The reads left: one NMS per image and the count of boxes it kept (the RPN, which
    reads the target boxes' check with it), the positives' count (mask head), and the
    level counts of the box and mask poolers. torchvision's code made 7 + 17 per image at
    these sizes."""
    spec = tiny_spec.model_copy(update={"train_batch_size": batch})
    expected = Counter({"torchvision.nms.default": batch, "Tensor.tolist": 4})
    assert _reads_per_step(spec, steps=4) == [expected, expected]


@pytest.mark.parametrize("batch", [1, 3])
def test_a_training_step_makes_a_tensor_from_host_data_only_in_a_cpus_nms(
    tiny_spec: ExperimentSpec, batch: int
) -> None:
    """None of maskops' code makes a tensor from host data in a step: the box coding
    (:mod:`maskops.modeling.box_coder`) and the poolers' level mapping use Python floats
    where torchvision's made 4 tensors per step (copies a GPU waited for) and 2 (CPU
    scalars on a GPU). The one per image left is torchvision's ``batched_nms``, which
    ``nms_by_group`` runs on a CPU and which makes ``torch.tensor(1)`` for its groups'
    offsets; on a GPU ``nms_by_group`` makes one NMS call (``nms_in_one_call``) without
    it."""
    spec = tiny_spec.model_copy(update={"train_batch_size": batch})
    steps = _counted_steps(spec, steps=4)
    assert [counter.from_host for counter in steps] == [batch, batch], [
        counter.from_host_by_call for counter in steps
    ]


def test_each_image_of_a_batch_adds_few_operators_to_a_step(tiny_spec: ExperimentSpec) -> None:
    """The host's work per step grows little with the batch: the RPN's and RoI heads'
    matching, sampling and mask targets run for the batch at once. Per-image loops there
    made it 275 operators per image at these sizes; 99 now."""
    operators = {}
    for batch in (1, 3):
        spec = tiny_spec.model_copy(update={"train_batch_size": batch})
        operators[batch] = _counted_steps(spec, steps=3)[-1].operators
    per_image = (operators[3] - operators[1]) / 2
    assert 0 < per_image <= 120, operators
