"""The hooks a training run is assembled from.

Order matters and is the order :func:`maskops.training.train.run_training` registers them:
cancellation (before a step), training metrics, checkpoint, evaluation, early stop, then
the writers (log/JSONL/TensorBoard), status file and progress bar, which report what the
hooks before them produced in the same step. Only rank 0 runs hooks that write files;
the other ranks run a checkpoint hook (their random state) and the evaluation hook (their
shard of the validation set), at the same steps as rank 0.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from maskops.atomic import atomic_write
from maskops.training.errors import EvaluationAbandoned
from maskops.training.optim import l2_loss_value
from maskops.training.trainer import HookBase

logger = logging.getLogger("maskops.train")

TOTAL_LOSS = "Total loss"
L2_LOSS = "L2 loss"
LEARNING_RATE = "learning rate"
SAMPLES_PER_SEC = "samples/sec"
PER_CLASS_KEYS = ("AP", "mask_AP")
"""Per-class metrics are published as ``AP/<class name>`` and ``mask_AP/<class name>``."""
GRADIENT_NORM = "gradient norm"
"""The global gradient norm before clipping; logged when global_gradient_clip_ratio is set."""

EvalFn = Callable[[nn.Module, int], dict[str, float]]
"""``(model in eval or train mode as the function sets it, step) -> metrics``; raises
:class:`~maskops.training.errors.EvaluationAbandoned` when a cancel stopped it."""


def _due(step: int, period: int, max_steps: int) -> bool:
    return step == max_steps or (period > 0 and step % period == 0)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never a torn one."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


class CancelHook(HookBase):
    """Stops at the next step boundary once ``should_cancel()`` is true.

    The run then saves a checkpoint of the last completed step and
    :func:`~maskops.training.train.run_training` raises
    :class:`~maskops.training.errors.TrainingCancelled`.
    """

    def __init__(self, should_cancel: Callable[[], bool]) -> None:
        self.should_cancel = should_cancel

    @classmethod
    def on_file(cls, path: Path) -> CancelHook:
        """Cancel when ``path`` exists: a flag another process can set."""
        return cls(path.exists)

    def before_step(self) -> None:
        if self.should_cancel():
            self.trainer.request_stop("cancelled", cancel=True)


def cancel_check(hooks: Sequence[HookBase]) -> Callable[[], bool]:
    """Whether a cancel hook (:class:`CancelHook`) among ``hooks`` asks to cancel: polled
    between the batches of an evaluation, which then stops (``EvaluationAbandoned``)."""
    checks = [hook.should_cancel for hook in hooks if isinstance(hook, CancelHook)]
    return lambda: any(check() for check in checks)


class TrainingMetricsHook(HookBase):
    """Every ``period`` steps (and the last): losses, L2 loss, Total loss, lr, samples/sec.

    Converting the losses to floats synchronises with the device, so it happens only here.
    L2 is applied by the optimizer; its value is computed for the log as TAO defines it.
    """

    def __init__(
        self, period: int, *, l2_params: Sequence[torch.Tensor], l2_weight_decay: float
    ) -> None:
        self.period = max(1, period)
        self.l2_params = l2_params
        self.l2_weight_decay = l2_weight_decay
        self._last_time = 0.0
        self._last_samples = 0

    def before_train(self) -> None:
        self._last_time = time.perf_counter()
        self._last_samples = self.trainer.samples_seen

    def after_step(self) -> None:
        trainer = self.trainer
        if not _due(trainer.iter, self.period, trainer.max_steps):
            return
        metrics = {k: float(v) for k, v in trainer.last_losses.items()}
        l2 = l2_loss_value(self.l2_params, self.l2_weight_decay) if self.l2_weight_decay else 0.0
        metrics[L2_LOSS] = l2
        metrics[TOTAL_LOSS] = sum(metrics.values())
        metrics[LEARNING_RATE] = trainer.lr
        if trainer.last_grad_norm is not None:
            metrics[GRADIENT_NORM] = float(trainer.last_grad_norm)
        now = time.perf_counter()
        elapsed = now - self._last_time
        samples = trainer.samples_seen - self._last_samples
        metrics[SAMPLES_PER_SEC] = samples / elapsed if elapsed > 0 else 0.0
        self._last_time, self._last_samples = now, trainer.samples_seen
        trainer.put_metrics(metrics)


class CheckpointHook(HookBase):
    """Saves every ``period`` steps (0 = only at the end), at the end, and when stopped;
    never after a failure."""

    def __init__(self, period: int, save: Callable[[int], Path]) -> None:
        self.period = period
        self.save = save
        self._saved_step = -1

    def before_train(self) -> None:
        self._saved_step = self.trainer.iter

    def _save(self) -> None:
        step = self.trainer.iter
        if step != self._saved_step:
            self.trainer.check_finite()  # never save a step whose loss was not finite
            self.trainer.last_checkpoint = self.save(step)
            self._saved_step = step

    def after_step(self) -> None:
        if self.period > 0 and self.trainer.iter % self.period == 0:
            self._save()

    def after_train(self) -> None:
        if self.trainer.exception is None:
            self._save()


def _isolated_rng(trainer: Any) -> Any:
    """A context in which RNG use leaves the training RNG untouched (resume exactness)."""
    devices = [trainer.device.index or 0] if trainer.device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


class EvalHook(HookBase):
    """Runs ``eval_fn`` every ``period`` steps and at the end; publishes its metrics.

    The evaluation runs inside ``torch.random.fork_rng`` so that it leaves the training RNG
    untouched: a resumed run (which does not repeat the evaluation) stays bit-identical to
    an uninterrupted one.

    In a run of several ranks every rank has this hook and evaluates its shard
    (:mod:`maskops.training.periodic_evaluation`), all at the same steps; ``agree`` (the evaluation
    group's :meth:`~maskops.training.distributed.EvalGroup.all_agree`) makes the ranks take
    the same decision on the final evaluation, which ranks see differently after a cancel
    (only rank 0 knows the stop was one). An evaluation a cancel abandoned publishes
    nothing and does not count as done.
    """

    def __init__(
        self, period: int, eval_fn: EvalFn, *, agree: Callable[[bool], bool] | None = None
    ) -> None:
        self.period = period
        self.eval_fn = eval_fn
        self.agree = agree
        self.last_eval_step = -1
        self._start_step = 0

    def _run(self) -> None:
        trainer = self.trainer
        trainer.check_finite()  # never evaluate weights a non-finite loss updated
        model = trainer.unwrapped
        was_training = model.training
        start = time.perf_counter()
        try:
            with _isolated_rng(trainer):
                metrics = self.eval_fn(model, trainer.iter)
        except EvaluationAbandoned:
            if trainer.is_main:
                logger.info("validation at step %d abandoned: cancelled", trainer.iter)
            return
        finally:
            model.train(was_training)
        self.last_eval_step = trainer.iter
        if trainer.is_main:
            seconds = time.perf_counter() - start
            logger.info("validation at step %d took %.1f s", trainer.iter, seconds)
        trainer.put_metrics(metrics)

    def after_step(self) -> None:
        if _due(self.trainer.iter, self.period, self.trainer.max_steps):
            self._run()

    def before_train(self) -> None:
        self._start_step = self.trainer.iter

    def after_train(self) -> None:
        # A stop before max_steps (early stop) still gets its final figures; a cancel, a
        # failure or a run that had nothing left to train does not evaluate.
        trainer = self.trainer
        if trainer.exception is not None:
            return  # no collective: the peers may be gone, torchrun stops the group
        wanted = (
            not trainer.cancelled
            and trainer.iter > self._start_step
            and self.last_eval_step != trainer.iter
        )
        if self.agree(wanted) if self.agree is not None else wanted:
            self._run()


BEST_FILE = "best_checkpoint.json"
"""Next to the checkpoints: which step and value ``model.best.pth`` holds."""


class BestCheckpointHook(HookBase):
    """Keeps the checkpoint with the best validation ``metric`` seen so far.

    After each evaluation of ``eval_hook`` (periodic and final), a value better than the
    best so far (higher, or lower when ``lower_is_better``) saves the model with
    ``save(step)`` and records ``{"metric", "value", "step", "checkpoint", "history"}`` in
    :data:`BEST_FILE` in ``directory``; ``history`` lists every evaluated ``[step, value]``.
    A resumed run continues from the recorded best.
    """

    def __init__(
        self,
        metric: str,
        eval_hook: EvalHook,
        save: Callable[[int], Path],
        directory: Path,
        *,
        lower_is_better: bool = False,
    ) -> None:
        self.metric = metric
        self.eval_hook = eval_hook
        self.save = save
        self.path = directory / BEST_FILE
        self.sign = -1.0 if lower_is_better else 1.0
        self.record: dict[str, Any] = {"metric": metric, "history": []}
        self._seen_step = -1
        self._warned = False

    def before_train(self) -> None:
        try:
            previous = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if previous.get("metric") == self.metric:
            self.record = previous

    def _better(self, value: float) -> bool:
        best = self.record.get("value")
        return best is None or self.sign * value > self.sign * float(best)

    def _check(self) -> None:
        trainer = self.trainer
        step = self.eval_hook.last_eval_step
        if step != trainer.iter or step == self._seen_step:
            return
        self._seen_step = step
        value = trainer.latest_metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            if not self._warned:
                logger.warning("best checkpoint: the evaluation reports no %s", self.metric)
                self._warned = True
            return
        self.record["history"].append([step, value])
        if self._better(value):
            path = self.save(step)
            self.record.update(value=value, step=step, checkpoint=path.name)
            logger.info("best %s so far: %.5f at step %d (%s)", self.metric, value, step, path.name)
        write_json_atomic(self.path, self.record)

    def after_step(self) -> None:
        self._check()

    def after_train(self) -> None:
        if self.trainer.exception is None:
            self._check()


class EarlyStopHook(HookBase):
    """Stops once validation ``AP`` >= target_box_ap and ``mask_AP`` >= target_mask_ap.

    A target of 0 is off. Targets are on the evaluator's scale (COCO AP in 0..1).
    """

    def __init__(self, *, target_box_ap: float, target_mask_ap: float) -> None:
        self.targets = {"AP": target_box_ap, "mask_AP": target_mask_ap}
        self.targets = {k: v for k, v in self.targets.items() if v > 0}

    def after_step(self) -> None:
        metrics = self.trainer.latest_metrics
        if not self.targets or not all(k in metrics for k in self.targets):
            return
        if all(metrics[k] >= target for k, target in self.targets.items()):
            reached = ", ".join(f"{k} {metrics[k]:.4f} >= {t}" for k, t in self.targets.items())
            logger.info("early stop at step %d: %s", self.trainer.iter, reached)
            self.trainer.request_stop(f"target reached: {reached}")


class MetricWriter(Protocol):
    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def is_per_class(key: str) -> bool:
    return key.split("/", 1)[0] in PER_CLASS_KEYS and "/" in key


class LogWriter:
    """``step N/T: RPN score loss: 0.123, ...`` lines in TAO's vocabulary (per-class AP is
    left out: the evaluation logs it as a table)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def write(self, step: int, metrics: dict[str, float]) -> None:
        body = ", ".join(f"{k}: {_fmt(v)}" for k, v in metrics.items() if not is_per_class(k))
        if body:
            logger.info("step %d/%d: %s", step, self.max_steps, body)

    def close(self) -> None:
        pass


def _fmt(value: float) -> str:
    return f"{value:.3e}" if value != 0 and abs(value) < 1e-3 else f"{value:.5f}"


class JsonlWriter:
    """``metrics.jsonl``: one ``{"step": N, "time": ..., metrics...}`` object per line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        pass


def recorded_metrics(path: Path, up_to_step: int) -> dict[str, float]:
    """Each metric's latest value in a ``metrics.jsonl`` among the records of steps up to
    ``up_to_step`` (empty without the file; a line cut short by a crash is skipped)."""
    latest: dict[str, float] = {}
    if not path.is_file():
        return latest
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and step <= up_to_step:
            latest.update({k: v for k, v in record.items() if k not in ("step", "time")})
    return latest


class TensorBoardWriter:
    """Scalars under their TAO names (``val/`` and ``eval/`` prefixes kept as given)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WriterHook(HookBase):
    """Hands every metric published in a step to the writers."""

    def __init__(self, writers: Sequence[MetricWriter]) -> None:
        self.writers = list(writers)

    def _flush(self) -> None:
        for step, metrics in self.trainer.pop_pending_metrics():
            for writer in self.writers:
                writer.write(step, metrics)

    def after_step(self) -> None:
        self._flush()

    def after_train(self) -> None:
        self._flush()
        for writer in self.writers:
            writer.close()


class StatusHook(HookBase):
    """Maintains ``status.json`` for the worker: state, step, total, ETA, latest metrics.

    States: ``running``, ``succeeded``, ``stopped`` (early stop), ``cancelled``,
    ``failed`` (with ``error``). Rewritten atomically, always at the start and end; while
    running every ``every_steps`` steps (TAO's report_frequency) or, when that is 0, at
    most every ``min_interval_s``.
    """

    def __init__(self, path: Path, *, min_interval_s: float = 1.0, every_steps: int = 0) -> None:
        self.path = path
        self.min_interval_s = min_interval_s
        self.every_steps = every_steps
        self._last_write = 0.0
        self._start_step = 0
        self._start_time = 0.0

    def _write(self, state: str, error: str | None = None) -> None:
        trainer = self.trainer
        done = trainer.iter - self._start_step
        elapsed = time.perf_counter() - self._start_time
        remaining = trainer.max_steps - trainer.iter
        eta = elapsed / done * remaining if done > 0 else None
        status = {
            "state": state,
            "step": trainer.iter,
            "total_steps": trainer.max_steps,
            "eta_seconds": None if state != "running" else eta,
            "metrics": trainer.latest_metrics,
            "last_checkpoint": str(trainer.last_checkpoint) if trainer.last_checkpoint else None,
            "stop_reason": trainer.stop_reason,
            "error": error,
            "updated_at": datetime.now(UTC).isoformat(),
        }
        write_json_atomic(self.path, status)
        self._last_write = time.perf_counter()

    def before_train(self) -> None:
        self._start_step = self.trainer.iter
        self._start_time = time.perf_counter()
        self._write("running")

    def after_step(self) -> None:
        if self.every_steps > 0:
            due = self.trainer.iter % self.every_steps == 0
        else:
            due = time.perf_counter() - self._last_write >= self.min_interval_s
        if due:
            self._write("running")

    def after_train(self) -> None:
        trainer = self.trainer
        if trainer.exception is not None:
            self._write("failed", error=str(trainer.exception) or type(trainer.exception).__name__)
        elif trainer.cancelled:
            self._write("cancelled")
        elif trainer.stop_reason is not None:
            self._write("stopped")
        else:
            self._write("succeeded")


class ProgressHook(HookBase):
    """A tqdm bar on a terminal; nothing when stderr is a file or pipe."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._bar: Any = None

    def before_train(self) -> None:
        if self.enabled:
            from tqdm import tqdm

            trainer = self.trainer
            self._bar = tqdm(
                total=trainer.max_steps, initial=trainer.iter, unit="step", dynamic_ncols=True
            )

    def after_step(self) -> None:
        if self._bar is not None:
            self._bar.update(1)
            losses = self.trainer.latest_metrics
            if TOTAL_LOSS in losses:
                self._bar.set_postfix(loss=f"{losses[TOTAL_LOSS]:.4f}", refresh=False)

    def after_train(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ImageSummaryHook(HookBase):
    """``visualize_images_summary``: a few validation images with predicted boxes and
    masks in TensorBoard, whenever the evaluation runs.

    ``images_fn`` returns the images (float ``[3, H, W]`` in 0..1, resized and padded);
    predicted masks (box-relative ``M x M``) are pasted into the image frame for drawing.
    """

    def __init__(
        self,
        period: int,
        tensorboard: TensorBoardWriter,
        images_fn: Callable[[], Sequence[torch.Tensor]],
        class_names: Sequence[str],
        *,
        score_threshold: float = 0.5,
    ) -> None:
        self.period = period
        self.tensorboard = tensorboard
        self.images_fn = images_fn
        self.class_names = list(class_names)
        self.score_threshold = score_threshold

    @torch.no_grad()
    def _draw(self) -> None:
        from torchvision.models.detection.roi_heads import paste_masks_in_image
        from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

        trainer = self.trainer
        model = trainer.unwrapped
        was_training = model.training
        model.eval()
        try:
            with _isolated_rng(trainer):
                images = list(self.images_fn())
                outputs = model([img.to(trainer.device) for img in images])
        finally:
            model.train(was_training)
        for index, (image, output) in enumerate(zip(images, outputs, strict=True)):
            keep = output["scores"] >= self.score_threshold
            boxes = output["boxes"][keep].float().cpu()
            labels = output["labels"][keep].cpu().tolist()
            canvas = (image.clamp(0, 1) * 255).to(torch.uint8).cpu()
            if "masks" in output and len(boxes):
                masks = paste_masks_in_image(
                    output["masks"][keep].float().cpu(), boxes, tuple(image.shape[-2:])
                )[:, 0]
                canvas = draw_segmentation_masks(canvas, masks >= 0.5, alpha=0.45)
            names = [
                self.class_names[lbl - 1] if 0 < lbl <= len(self.class_names) else str(lbl)
                for lbl in labels
            ]
            if len(boxes):
                canvas = draw_bounding_boxes(canvas, boxes, labels=names, colors="yellow")
            self.tensorboard.writer.add_image(f"val_images/{index}", canvas, trainer.iter)
        self.tensorboard.writer.flush()

    def after_step(self) -> None:
        if _due(self.trainer.iter, self.period, self.trainer.max_steps):
            self._draw()
