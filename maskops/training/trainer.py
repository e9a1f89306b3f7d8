"""A small training loop with hooks (in the style of detectron2's ``engine``).

The :class:`Trainer` owns only the step: fetch ``accumulate_grad_steps`` micro-batches, run
forward under autocast, add the L1 penalty, backward (scaled when fp16), one optimizer
update at the learning rate the schedule gives for that step. Everything periodic
(checkpoints, validation, logging, progress, status file, early stop, cancellation) is a
:class:`HookBase` subclass, so the CLI and the Celery task assemble the same loop.

Step counting: ``trainer.iter`` is the number of completed optimizer steps. Checkpoints are
named by it; the step being computed is ``iter + 1`` in messages (1-based, as users count).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from maskops.modeling import LOSS_NAMES
from maskops.modeling.model import COMPILE_MODES
from maskops.training.errors import NonFiniteLossError, SkippedStepsError
from maskops.training.optim import l1_penalty
from maskops.training.prefetch import Batch, move_batch
from maskops.training.schedule import apply_learning_rate

L1_LOSS = "L1 loss"
AMPERE_CAPABILITY = (8, 0)
"""The first CUDA compute capability with bf16 and TF32 tensor cores (Ampere, sm_80): bf16
autocast needs no loss scaling there, and fp32 convolutions run on tensor cores (TF32,
PyTorch's cuDNN default)."""
MAX_SKIPPED_STEPS = 50
"""Consecutive optimizer steps the fp16 loss scaler may skip before the run fails.

The scaler starts at 2^16 and halves at every skipped step, so a healthy run skips a few
steps at its start (until the scaled gradients fit fp16) and one now and then after that.
After 50 skips in a row the scale is 2^-34: gradients that still overflow are not a scaling
problem (the run diverged), and a loss that is non-finite in the forward pass, which no
scale cures, has then wasted 50 steps, not hours."""

logger = logging.getLogger("maskops.train")


def tao_loss_name(key: str) -> str:
    """TAO's name for one of torchvision's loss keys."""
    return LOSS_NAMES.get(key, key)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 convolutions natively on this CPU (AVX-512 BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cuda_bf16_native(capability: tuple[int, int]) -> bool:
    """Whether a CUDA device of compute ``capability`` (major, minor) computes bf16 natively.

    ``torch.cuda.is_bf16_supported()`` is not this: it also counts emulation (bf16 runs on a
    pre-Ampere GPU, slower than fp16) and asks about the current device, not the one trained
    on.
    """
    return tuple(capability) >= AMPERE_CAPABILITY


def trains_channels_last(device: torch.device, capability: tuple[int, int] | None = None) -> bool:
    """Whether training on ``device`` keeps weights and activations channels_last (NHWC);
    ``capability``: a CUDA device's compute capability (probed when None).

    On a CPU oneDNN computes NHWC convolutions without reordering every input and output
    to its blocked layout and back: a training step at 512x512 took 14% less time in fp32
    and 15% less in bf16 (bench/bench_train.py, AVX-512 host; detections are unchanged,
    tests/unit/modeling/test_model.py). On CUDA from Ampere on, cuDNN's tensor-core
    convolutions take NHWC as it is: R50-FPN at 832x1344, batch 4, trained 1.03-1.18x as
    fast in bf16 and 1.17-1.19x in fp32 (TF32), four and two alternated rounds on an H100
    (bench/results/gpu_check.json, bench_train_cuda_layout.json; 2026-11-27). Older GPUs,
    whose fp32 convolutions have no tensor cores, stay NCHW (unmeasured).
    """
    if device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    return tuple(capability) >= AMPERE_CAPABILITY


@dataclass(frozen=True)
class DeviceTuning:
    """How training feeds its device and lays out its tensors; None = the device's default.

    On CUDA the loader pins its batches by default (``pin_memory``: a ``non_blocking`` copy
    from pageable memory is synchronous, so the host would wait for every copy). cuDNN's
    algorithm search (``cudnn_benchmark``) is off unless asked for, as in detectron2 and
    torchvision's references: the backbone sees one padded ``image_size``, but the mask
    head sees a different number of RoIs nearly every step, and each new shape is searched
    again, forward and backward. On an H100 (R50-FPN 832x1344, bf16, 10 timed steps after
    3; bench/results/gpu_check.json) training ran 0.80-0.96x as fast with unpinned batches
    and 0.105-0.126x as fast with the search on. Both are off on a CPU, where they do
    nothing. ``channels_last``: :func:`trains_channels_last`. bench/gpu_check's
    ``throughput_tuning`` measures each default against its flip on a GPU.

    Three more are off until a GPU measurement says they win (each is an arm of
    ``throughput_tuning``): ``fused_optimizer`` (one fused SGD kernel, on a CPU too; torch's
    SGD is already a multi-tensor ``foreach`` update on CUDA), ``tf32_matmul`` (float32
    matrix products on TF32 tensor cores, CUDA only; cuDNN's convolutions use TF32 by
    PyTorch's default) and ``uint8_images`` (the loader hands over uint8 images, a quarter
    of the bytes, which the model divides by 255 on its device, bit for bit as the
    loader would).

    Three more, also off until a GPU measurement says they win (arms of
    ``throughput_tuning``; none measured on a GPU yet): ``prefetch_stream`` (the next
    batch is copied to the GPU on a side CUDA stream while the current step computes:
    :class:`maskops.training.prefetch.DevicePrefetcher`; it needs pinned batches to
    overlap, and on a CPU it passes the batches through), ``compact_masks`` (each
    instance's mask crosses to the device cropped to its box, not as a full
    ``image_size`` frame, about 1 MB an instance at 832x1344; the mask head's targets are
    the same: :mod:`maskops.mask_crops`) and
    ``compiled_backbone`` (the backbone and FPN compiled by ``torch.compile`` for the one
    padded ``image_size``, in that mode: one of
    :data:`maskops.modeling.model.COMPILE_MODES`; None = eager).
    ``one_nms_per_batch`` (also off until measured): the RPN's NMS runs once for the
    batch instead of once per image, one read of the device instead of one per image for
    B times the box pairs; the proposals are the same. ``segmented_nms`` (also off until
    measured; not with ``one_nms_per_batch``): every (image, FPN level)'s NMS settled side
    by side (:func:`maskops.modeling.nms.greedy_nms_by_segment`), where one NMS call per
    image gathers its kept boxes in one GPU thread block, box after box (12 ms of a 122 ms
    step on an H200); the proposals are the same. ``graphed_backbone`` (also off
    until measured; CUDA only, one process, no gradient accumulation): the backbone and
    FPN's training forward and
    backward captured once and replayed as CUDA graphs
    (:func:`maskops.training.graphed.graph_backbone`); not with ``compiled_backbone``.
    """

    channels_last: bool | None = None
    pin_memory: bool | None = None
    cudnn_benchmark: bool | None = None
    fused_optimizer: bool | None = None
    tf32_matmul: bool | None = None
    uint8_images: bool | None = None
    prefetch_stream: bool | None = None
    compact_masks: bool | None = None
    compiled_backbone: str | None = None
    one_nms_per_batch: bool | None = None
    graphed_backbone: bool | None = None
    segmented_nms: bool | None = None

    def __post_init__(self) -> None:
        if self.one_nms_per_batch and self.segmented_nms:
            raise ValueError("one_nms_per_batch and segmented_nms: choose one")
        if self.compiled_backbone is not None and self.graphed_backbone:
            raise ValueError("compiled_backbone and graphed_backbone: choose one")
        if self.compiled_backbone is not None and self.compiled_backbone not in COMPILE_MODES:
            raise ValueError(
                f"compiled_backbone: {self.compiled_backbone!r} is not a torch.compile mode "
                f"({', '.join(COMPILE_MODES)}) or None"
            )

    def resolve(
        self, device: torch.device, capability: tuple[int, int] | None = None
    ) -> DeviceTuning:
        """Every switch decided for ``device`` (``capability``: :func:`trains_channels_last`)."""
        cuda = device.type == "cuda"
        channels_last = self.channels_last
        if channels_last is None:
            channels_last = trains_channels_last(device, capability)
        return DeviceTuning(
            channels_last=channels_last,
            pin_memory=cuda if self.pin_memory is None else self.pin_memory and cuda,
            cudnn_benchmark=bool(self.cudnn_benchmark) and cuda,
            fused_optimizer=bool(self.fused_optimizer),
            tf32_matmul=bool(self.tf32_matmul) and cuda,
            uint8_images=bool(self.uint8_images),
            prefetch_stream=bool(self.prefetch_stream),
            compact_masks=bool(self.compact_masks),
            compiled_backbone=self.compiled_backbone,
            one_nms_per_batch=bool(self.one_nms_per_batch),
            graphed_backbone=bool(self.graphed_backbone) and cuda,
            segmented_nms=bool(self.segmented_nms),
        )


@dataclass(frozen=True)
class AmpSettings:
    """Mixed precision for one device type.

    On CUDA: bf16 where the training device computes it natively (compute capability >= 8.0,
    :func:`cuda_bf16_native`; no loss scaling needed), else fp16 with a GradScaler. On CPU:
    bf16 autocast only where oneDNN has native bf16 kernels (AVX-512 BF16 / AMX); elsewhere
    bf16 convolutions fall back to a reference kernel several times slower than fp32
    (measured: 3-10x on an AVX2-only host), so AMP is declined there and ``declined`` says
    why.
    """

    enabled: bool
    device_type: str
    dtype: torch.dtype = torch.bfloat16
    declined: str = ""

    @classmethod
    def for_device(
        cls,
        device: torch.device,
        *,
        enabled: bool,
        cpu_bf16_native: bool | None = None,
        cuda_capability: tuple[int, int] | None = None,
    ) -> AmpSettings:
        """``cpu_bf16_native`` / ``cuda_capability``: what the device offers (probed when
        None)."""
        if device.type == "cuda":
            if cuda_capability is None:
                cuda_capability = torch.cuda.get_device_capability(device)
            native = cuda_bf16_native(cuda_capability)
            dtype = torch.bfloat16 if native else torch.float16
            return cls(enabled=enabled, device_type="cuda", dtype=dtype)
        native = cpu_has_native_bf16() if cpu_bf16_native is None else cpu_bf16_native
        if enabled and not native:
            reason = "use_amp ignored: this CPU has no native bf16 kernels, bf16 would be slower"
            return cls(enabled=False, device_type=device.type, declined=reason)
        return cls(enabled=enabled, device_type=device.type, dtype=torch.bfloat16)

    @property
    def needs_scaler(self) -> bool:
        return self.enabled and self.dtype == torch.float16

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


class HookBase:
    """Called around the loop; ``self.trainer`` is set when the hook is registered."""

    trainer: Trainer

    def before_train(self) -> None:
        """Once, before the first step (also on a resumed run)."""

    def before_step(self) -> None:
        """Before each step; a stop requested here prevents the step."""

    def after_step(self) -> None:
        """After each completed optimizer step (``trainer.iter`` counts it)."""

    def after_train(self) -> None:
        """Once at the end, also after a failure (``trainer.exception`` is then set)."""


@dataclass
class Trainer:
    """Runs optimizer steps ``start_step + 1 .. max_steps`` and calls the hooks.

    ``model`` may be wrapped in DistributedDataParallel; ``unwrapped`` is the bare model.
    ``data`` yields micro-batches forever (the data position is ``iter * accumulate``).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: Iterator[Batch]
    schedule: Callable[[int], float]
    max_steps: int
    device: torch.device
    amp: AmpSettings
    start_step: int = 0
    accumulate_grad_steps: int = 1
    scaler: torch.amp.GradScaler | None = None
    l1_params: Sequence[torch.Tensor] = ()
    l1_weight_decay: float = 0.0
    world_size: int = 1
    rank: int = 0
    clip_grad_norm: float = 0.0
    """TAO's global_gradient_clip_ratio: the most the global L2 norm of all gradients may be
    at an update (after accumulation and DDP averaging, before momentum); 0 = no clipping."""
    max_skipped_steps: int = MAX_SKIPPED_STEPS
    """With a loss scaler: the run fails once this many steps in a row were skipped."""
    finite_check_period: int = 1
    """Without a loss scaler: steps between the checks that the loss is finite. Each check
    waits for the device, so 1 (at once, before the backward) makes the host wait at every
    micro-batch; with more, the losses stay on the device until :meth:`check_finite` runs
    after every ``finite_check_period``-th step, at the last step and before a checkpoint
    or an evaluation (hooks call it), so no non-finite step is saved or evaluated; the
    run then fails naming the first non-finite step, at most that many steps later."""

    iter: int = field(init=False)
    lr: float = field(init=False, default=0.0)
    last_losses: dict[str, torch.Tensor] = field(init=False, default_factory=dict)
    """The last applied step's losses (TAO names, detached, averaged over micro-batches): a
    step the loss scaler skips leaves them as they were."""
    last_grad_norm: torch.Tensor | None = field(init=False, default=None)
    """The last step's global gradient norm before clipping (0-dim); only when clipping."""
    latest_metrics: dict[str, float] = field(init=False, default_factory=dict)
    """Every metric published so far, latest value each (training and validation)."""
    samples_seen: int = field(init=False, default=0)
    """Images processed by this run on all ranks (a resumed run counts from 0)."""
    skipped_steps: int = field(init=False, default=0)
    """Steps whose update the fp16 loss scaler skipped (non-finite loss or gradients)."""
    skipped_in_a_row: int = field(init=False, default=0)
    stop_reason: str | None = field(init=False, default=None)
    cancelled: bool = field(init=False, default=False)
    exception: BaseException | None = field(init=False, default=None)
    last_checkpoint: Path | None = field(init=False, default=None)
    """Set by the checkpoint hook (or by the caller on resume)."""
    _hooks: list[HookBase] = field(init=False, default_factory=list)
    _pending: list[tuple[int, dict[str, float]]] = field(init=False, default_factory=list)
    _scale: float | None = field(init=False, default=None)
    _unchecked: list[tuple[int, tuple[str, ...], torch.Tensor]] = field(
        init=False, default_factory=list
    )
    """Per micro-batch since the last :meth:`check_finite`: its step, its loss names and
    ``[1 + L]`` (total, then each loss), on the device."""

    def __post_init__(self) -> None:
        self.iter = self.start_step
        if self.accumulate_grad_steps < 1:
            raise ValueError(
                f"accumulate_grad_steps must be >= 1, got {self.accumulate_grad_steps}"
            )

    @property
    def unwrapped(self) -> nn.Module:
        module = getattr(self.model, "module", self.model)
        assert isinstance(module, nn.Module)
        return module

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def register_hooks(self, hooks: Sequence[HookBase]) -> None:
        for hook in hooks:
            hook.trainer = self
            self._hooks.append(hook)

    def request_stop(self, reason: str, *, cancel: bool = False) -> None:
        """Stop at the next step boundary (all ranks agree before the next step)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.cancelled = self.cancelled or cancel

    def put_metrics(self, metrics: dict[str, float], *, step: int | None = None) -> None:
        """Publish metrics for writer hooks (log, TensorBoard, status file)."""
        self.latest_metrics.update(metrics)
        self._pending.append((self.iter if step is None else step, dict(metrics)))

    def pop_pending_metrics(self) -> list[tuple[int, dict[str, float]]]:
        pending, self._pending = self._pending, []
        return pending

    def train(self) -> None:
        self.model.train()
        for hook in self._hooks:
            hook.before_train()
        try:
            while self.iter < self.max_steps:
                for hook in self._hooks:
                    hook.before_step()
                if self._stop_agreed():
                    break
                self.run_step()
                if self._finite_check_due():
                    self.check_finite()
                for hook in self._hooks:
                    hook.after_step()
            self.check_finite()  # a stop between checks: before after_train saves
        except BaseException as exc:
            self.exception = exc
            raise
        finally:
            for hook in self._hooks:
                hook.after_train()

    def _stop_agreed(self) -> bool:
        # Every rank must take the same branch, or the next collective deadlocks.
        if self.world_size > 1 and dist.is_initialized():
            flag = torch.tensor([1 if self.stop_reason else 0], dtype=torch.int32)
            if dist.get_backend() == "nccl":
                flag = flag.to(self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and self.stop_reason is None:
                self.stop_reason = "stopped by another rank"
            return bool(flag.item())
        return self.stop_reason is not None

    def run_step(self) -> None:
        self.lr = self.schedule(self.iter)
        apply_learning_rate(self.optimizer, self.lr)
        accumulate = self.accumulate_grad_steps
        sums: dict[str, torch.Tensor] = {}
        for micro in range(accumulate):
            images, targets = move_batch(next(self.data), self.device)
            last = micro == accumulate - 1
            no_sync = getattr(self.model, "no_sync", None)
            sync_ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
            with sync_ctx:
                with self.amp.autocast():
                    loss_dict = self.model(images, targets)
                losses = {tao_loss_name(k): v.float() for k, v in loss_dict.items()}
                if self.l1_weight_decay > 0:
                    # Outside autocast: a sum over every kernel wants fp32.
                    losses[L1_LOSS] = l1_penalty(self.l1_params, self.l1_weight_decay)
                total = torch.stack(list(losses.values())).sum()
                # With a loss scaler a non-finite loss makes non-finite gradients, and the
                # scaler skips the update and lowers its scale (torch AMP's design): the
                # run goes on (_count_skipped). Without one nothing would skip it.
                if self.scaler is None:
                    self._watch_finite(total, losses)
                scaled = total / accumulate
                if self.scaler is not None:
                    self.scaler.scale(scaled).backward()
                else:
                    scaled.backward()
            for key, value in losses.items():
                detached = value.detach() / accumulate
                sums[key] = sums[key] + detached if key in sums else detached
            self.samples_seen += len(images) * self.world_size
        if self.clip_grad_norm > 0:
            self._clip_gradients()
        if self.scaler is not None:
            if self._scale is None:  # the first step of this run: the scale it starts at
                self._scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self._count_skipped(sums)
        else:
            self.optimizer.step()
            skipped = False
        self.optimizer.zero_grad(set_to_none=True)
        if skipped:
            # Metrics stay finite (status.json and the jobs database hold JSON, which has
            # no inf): the losses shown remain the last applied step's.
            self.last_grad_norm = None
        else:
            self.last_losses = sums
        self.iter += 1

    def _watch_finite(self, total: torch.Tensor, losses: dict[str, torch.Tensor]) -> None:
        """Fail now on a non-finite ``total`` (``finite_check_period`` 1), or keep it, on the
        device, for the next :meth:`check_finite`."""
        if self.finite_check_period <= 1:
            if not bool(torch.isfinite(total)):
                raise NonFiniteLossError(
                    self.iter + 1, {k: float(v.detach()) for k, v in losses.items()}
                )
            return
        values = torch.stack([total.detach(), *(v.detach() for v in losses.values())])
        self._unchecked.append((self.iter + 1, tuple(losses), values))

    def check_finite(self) -> None:
        """Wait for the device once and fail if a loss kept since the last check was not
        finite, naming the first such step and its losses.

        Raises:
            NonFiniteLossError: a kept micro-batch's total loss was NaN or infinite.
        """
        unchecked, self._unchecked = self._unchecked, []
        if not unchecked or bool(torch.stack([v[0] for _, _, v in unchecked]).isfinite().all()):
            return
        for step, names, values in unchecked:
            if not bool(values[0].isfinite()):
                raise NonFiniteLossError(step, dict(zip(names, values[1:].tolist(), strict=True)))

    def _finite_check_due(self) -> bool:
        period = max(1, self.finite_check_period)
        return self.iter % period == 0 or self.iter >= self.max_steps

    def _count_skipped(self, losses: dict[str, torch.Tensor]) -> bool:
        """Whether the scaler skipped this step (it lowers its scale exactly then), counted.

        Raises:
            SkippedStepsError: ``max_skipped_steps`` steps in a row were skipped.
        """
        assert self.scaler is not None and self._scale is not None
        previous = self._scale
        self._scale = self.scaler.get_scale()  # one device synchronisation per step
        if self._scale >= previous:
            self.skipped_in_a_row = 0
            return False
        self.skipped_steps += 1
        self.skipped_in_a_row += 1
        values = {k: float(v) for k, v in losses.items()}
        if self.skipped_in_a_row >= self.max_skipped_steps:
            raise SkippedStepsError(self.iter + 1, self.skipped_in_a_row, values)
        logger.warning(
            "step %d: update skipped by the fp16 loss scaler (non-finite loss or gradients; "
            "scale now %g), %d in a row (the run fails at %d)",
            self.iter + 1,
            self._scale,
            self.skipped_in_a_row,
            self.max_skipped_steps,
        )
        return True

    def _clip_gradients(self) -> None:
        if self.scaler is not None:
            # Clip the true gradients, not the loss-scaled ones; step() will not unscale twice.
            self.scaler.unscale_(self.optimizer)
        params = [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        # Kept as a tensor: converting it to a float would synchronise with the device.
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm).detach()
