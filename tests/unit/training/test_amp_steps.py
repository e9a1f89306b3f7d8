"""Mixed precision decisions and the fp16 loss scaler's skipped steps, on the CPU.

bf16 is chosen by the training device's compute capability (a pure function, tested for
every GPU generation without one); a GradScaler (``torch.amp.GradScaler("cpu")``, the same
class CUDA uses) skips the steps whose loss a hook makes infinite, and the run goes on
unless the steps are skipped many times in a row.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from maskops.data.pipeline import build_train_loader
from maskops.spec.models import ExperimentSpec
from maskops.training.errors import NonFiniteLossError, SkippedStepsError
from maskops.training.optim import build_optimizer
from maskops.training.seeding import seed_everything
from maskops.training.train import build_training_model
from maskops.training.trainer import (
    MAX_SKIPPED_STEPS,
    AmpSettings,
    DeviceTuning,
    HookBase,
    Trainer,
    cuda_bf16_native,
    trains_channels_last,
)


@pytest.mark.parametrize(
    ("capability", "native"),
    [((6, 1), False), ((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 9), True),
     ((9, 0), True), ((10, 0), True), ((12, 0), True)],
)  # fmt: skip
def test_bf16_only_where_the_training_gpu_computes_it_natively(
    capability: tuple[int, int], native: bool
) -> None:
    assert cuda_bf16_native(capability) is native
    amp = AmpSettings.for_device(torch.device("cuda", 1), enabled=True, cuda_capability=capability)
    assert amp.dtype == (torch.bfloat16 if native else torch.float16)
    assert amp.needs_scaler is (not native)  # fp16 trains with a GradScaler


@pytest.mark.parametrize(
    ("capability", "channels_last"), [((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_device_tuning_defaults_and_switches(
    capability: tuple[int, int], channels_last: bool
) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    # Fused SGD, TF32 matmuls, uint8 images, the prefetch stream, compact masks, the
    # compiled backbone, one NMS per batch, the graphed backbone and the segmented NMS:
    # off unless asked.
    off = (False, False, False, False, False, None, False, False, False)
    assert DeviceTuning().resolve(cpu) == DeviceTuning(True, False, False, *off)
    # channels_last from Ampere on, where fp32 (TF32) and bf16 convolutions use tensor cores.
    expected = DeviceTuning(channels_last, True, False, *off)
    assert DeviceTuning().resolve(cuda, capability) == expected
    assert trains_channels_last(cuda, capability) is channels_last
    flipped = DeviceTuning(
        not channels_last, False, False, True, True, True, True, True, "default", True, False,
        False,
    )  # fmt: skip
    assert flipped.resolve(cuda, capability) == flipped
    graphed = DeviceTuning(graphed_backbone=True)
    assert graphed.resolve(cuda, capability).graphed_backbone is True
    segmented = DeviceTuning(segmented_nms=True)
    on_cuda = segmented.resolve(cuda, capability)
    assert segmented.resolve(cpu).segmented_nms is on_cuda.segmented_nms is True
    with pytest.raises(ValueError, match="choose one"):
        DeviceTuning(one_nms_per_batch=True, segmented_nms=True)
    assert DeviceTuning(cudnn_benchmark=True).resolve(cuda, capability).cudnn_benchmark is True
    # Pinning, cuDNN and TF32 are CUDA's: asked for on a CPU they stay off. The prefetcher
    # passes batches through there, so its path runs on a CPU too.
    asked = DeviceTuning(False, True, True, True, True, True, True, True, "max-autotune", True)
    on_cpu = DeviceTuning(False, False, False, True, False, True, True, True, "max-autotune", True)
    off_on_cpu = {"graphed_backbone": False, "segmented_nms": False}
    assert asked.resolve(cpu) == DeviceTuning(**{**vars(on_cpu), **off_on_cpu})
    assert graphed.resolve(cpu).graphed_backbone is False  # CUDA graphs are CUDA's
    assert not trains_channels_last(torch.device("meta"))
    with pytest.raises(ValueError, match=r"compiled_backbone: 'fast' is not a torch\.compile mode"):
        DeviceTuning(compiled_backbone="fast")


class InfiniteLoss(HookBase):
    """Multiplies the model's losses by inf during the given (1-based) steps, through a
    forward hook on the model: the loss the trainer sees is really non-finite."""

    def __init__(self, steps: set[int] | None) -> None:
        self.steps = steps
        self.active = False
        self.weights: list[torch.Tensor] = []
        self.finite_metrics: list[bool] = []

    def before_train(self) -> None:
        self.trainer.unwrapped.register_forward_hook(self._poison)

    def _poison(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        if not self.active:
            return None
        return {key: value * math.inf for key, value in output.items()}

    def before_step(self) -> None:
        self.active = self.steps is None or self.trainer.iter + 1 in self.steps

    def after_step(self) -> None:
        weight = next(p for p in self.trainer.unwrapped.parameters() if p.requires_grad)
        self.weights.append(weight.detach().clone())
        norm = self.trainer.last_grad_norm
        values = [*self.trainer.last_losses.values(), *([norm] if norm is not None else [])]
        self.finite_metrics.append(all(bool(torch.isfinite(v)) for v in values))


def _trainer(
    spec: ExperimentSpec, scaler: torch.amp.GradScaler | None, fused: bool = False, **kw: Any
) -> Trainer:
    seed_everything(spec.seed)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes)
    return Trainer(
        model=model,
        optimizer=build_optimizer(model, lr=0.004, momentum=0.9, l2_weight_decay=1e-4, fused=fused),
        data=iter(build_train_loader(spec)),
        schedule=lambda step: 0.004,
        device=torch.device("cpu"),
        amp=AmpSettings(enabled=False, device_type="cpu"),
        scaler=scaler,
        **kw,
    )


def test_the_loss_scaler_skips_non_finite_steps_and_the_run_goes_on(
    tiny_spec: ExperimentSpec,
) -> None:
    # Accumulation and clipping on: unscale_ before the clip sees the inf as well.
    trainer = _trainer(
        tiny_spec,
        torch.amp.GradScaler("cpu"),
        max_steps=5,
        accumulate_grad_steps=2,
        clip_grad_norm=10.0,
    )
    poison = InfiniteLoss({2, 3})
    trainer.register_hooks([poison])
    trainer.train()
    assert trainer.iter == 5 and trainer.skipped_steps == 2 and trainer.skipped_in_a_row == 0
    after = poison.weights  # after steps 1..5
    assert torch.equal(after[0], after[1]) and torch.equal(after[1], after[2])  # 2, 3 skipped
    assert not torch.equal(after[2], after[3]) and not torch.equal(after[3], after[4])
    assert all(torch.isfinite(w).all() for w in after)
    assert poison.finite_metrics == [True] * 5  # a skipped step publishes no inf
    assert trainer.scaler is not None and trainer.scaler.get_scale() == 2.0**16 / 4


def test_steps_skipped_in_a_row_fail_the_run_saying_so(tiny_spec: ExperimentSpec) -> None:
    assert MAX_SKIPPED_STEPS >= 30  # a healthy fp16 start skips a few: see its docstring
    trainer = _trainer(tiny_spec, torch.amp.GradScaler("cpu"), max_steps=10, max_skipped_steps=3)
    trainer.register_hooks([InfiniteLoss(None)])
    with pytest.raises(SkippedStepsError, match=r"3 optimizer steps in a row skipped") as info:
        trainer.train()
    assert info.value.step == 3 and "non-finite loss or gradients" in str(info.value)
    assert isinstance(info.value, NonFiniteLossError)


def test_without_a_scaler_a_non_finite_loss_fails_at_once(
    tiny_spec: ExperimentSpec, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_spec, None, max_steps=4)
    trainer.register_hooks([InfiniteLoss({2})])
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 2"):
        trainer.train()
    assert trainer.iter == 1


class LossLog(HookBase):
    """Each step's losses, as floats (after the step, so it does not change when checks run)."""

    def __init__(self) -> None:
        self.losses: list[dict[str, float]] = []

    def after_step(self) -> None:
        self.losses.append({k: float(v) for k, v in self.trainer.last_losses.items()})


@pytest.mark.parametrize("change", ["finite_check_period", "fused"])
def test_losses_kept_on_the_device_and_fused_sgd_train_the_same(
    tiny_spec: ExperimentSpec, change: str
) -> None:
    """Checking the loss every 3 steps, or updating with torch's fused SGD, gives the same
    losses as checking at every step with the default SGD, and the same weights (the fused
    kernel's arithmetic may round the last bit differently, and the later steps' losses
    with it)."""
    runs = []
    for changed in (False, True):
        kw = {"finite_check_period": 3 if changed else 1, "fused": False}
        if change == "fused":
            kw = {"fused": changed}
        trainer = _trainer(tiny_spec, None, max_steps=4, **kw)  # type: ignore[arg-type]
        log = LossLog()
        trainer.register_hooks([log])
        trainer.train()
        runs.append((log.losses, [p.detach() for p in trainer.unwrapped.parameters()]))
    if change == "fused":
        assert [list(step) for step in runs[0][0]] == [list(step) for step in runs[1][0]]
        for default, fused in zip(runs[0][0], runs[1][0], strict=True):
            assert fused == pytest.approx(default, rel=1e-5, abs=1e-7)
    else:
        assert runs[0][0] == runs[1][0]
    for before, after in zip(runs[0][1], runs[1][1], strict=True):
        if change == "fused":
            torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(after, before)


class SaveAt(HookBase):
    """Calls what a checkpoint calls before saving, at one step: the check for non-finite
    losses kept on the device."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.saved: list[int] = []

    def after_step(self) -> None:
        if self.trainer.iter == self.step:
            self.trainer.check_finite()
            self.saved.append(self.trainer.iter)


@pytest.mark.parametrize(("save_at", "fails_at"), [(None, 4), (3, 3)])
def test_a_non_finite_loss_kept_on_the_device_fails_naming_its_step(
    tiny_spec: ExperimentSpec, save_at: int | None, fails_at: int
) -> None:
    """Checked every 4 steps, the loss of step 2 fails the run at step 4, or at a save
    before it, naming step 2; nothing is saved after it."""
    trainer = _trainer(tiny_spec, None, max_steps=8, finite_check_period=4)
    save = SaveAt(save_at or 0)
    trainer.register_hooks([InfiniteLoss({2}), save])
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 2 \(") as info:
        trainer.train()
    assert info.value.step == 2 and trainer.iter == fails_at and save.saved == []
