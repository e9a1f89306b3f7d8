"""``run_training``: the one entry point the CLI and the Celery task share.

Recipe decisions (TAO's where TAO has one):

* SGD with momentum. L2 weight decay on kernels only, applied by the optimizer; L1 as a
  real penalty ``l1_weight_decay / 2 * sum(|w|)`` in the loss, as TAO's
  ``tf.keras.regularizers.l1(l1_weight_decay / 2.0)`` (see :mod:`maskops.training.optim`).
* Learning rates: the spec's rates are used as written, as in TAO, whatever the number of
  processes: with ``--gpus N`` the batch per step is N times larger and the rates stay
  (TAO's notebook: multiply them by N in the spec yourself). The rates and the batch are
  logged at the start of the run.
* ``total_steps`` counts optimizer steps, each rank running all of them; with
  ``num_epochs`` it is ``num_epochs * num_examples_per_epoch / train_batch_size`` rounded
  up (TAO's train.py), divided by ``accumulate_grad_steps``: ``num_examples_per_epoch`` is
  per GPU, as in TAO (the training set divided by N).
* ``pruned_model_path``: the pruned architecture and weights are the starting point; the
  L1/L2 regularisers apply as written, as in TAO (write 0 to turn one off).
* Resume: when RESULTS_DIR holds ``model.step-N.pth`` checkpoints, the run continues from
  the newest with its optimizer, scaler, RNG states and data position, so that it ends
  where an uninterrupted run ends. ``checkpoint`` (pretrained weights) is then not loaded.
  A checkpoint of an earlier maskops, which read the fields above otherwise, resumes with
  the rules its run started with (:mod:`maskops.training.rules`) and the log says so.
* Only rank 0 writes checkpoints, logs, TensorBoard events and ``status.json``.
* The periodic evaluation is sharded across the ranks and gathered to rank 0
  (:mod:`maskops.training.periodic_evaluation`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from maskops.checkpoints.rank_state import restore_rank_state, resumable_checkpoint, save_rank_state
from maskops.checkpoints.run_directory import BEST_NAME, latest_checkpoint
from maskops.data.labels import LabelMap
from maskops.spec.models import VALIDATION_LOSS, ExperimentSpec
from maskops.training.checkpointer import Checkpointer, checkpoint_rules, read_training_state
from maskops.training.distributed import (
    EvalGroup,
    GroupTimeouts,
    RankInfo,
    run_rank,
    torchrun_env,
)
from maskops.training.errors import TrainingCancelled, TrainingError
from maskops.training.graphed import graph_backbone
from maskops.training.hooks import (
    BEST_FILE,
    BestCheckpointHook,
    CheckpointHook,
    EarlyStopHook,
    EvalFn,
    EvalHook,
    ImageSummaryHook,
    JsonlWriter,
    LogWriter,
    MetricWriter,
    ProgressHook,
    StatusHook,
    TensorBoardWriter,
    TrainingMetricsHook,
    WriterHook,
    cancel_check,
    recorded_metrics,
    write_json_atomic,
)
from maskops.training.optim import (
    build_optimizer,
    l1_regularized_parameters,
    regularized_parameters,
)
from maskops.training.periodic_evaluation import default_eval_fn
from maskops.training.prefetch import DevicePrefetcher
from maskops.training.results import STATUS_FILE, TrainResult
from maskops.training.rules import TAO_RULES, TrainingRules
from maskops.training.schedule import LRSchedule
from maskops.training.seeding import seed_everything
from maskops.training.trackers import RunEnd, check_trackers, tracker_writers
from maskops.training.trainer import (
    AmpSettings,
    Batch,
    DeviceTuning,
    HookBase,
    Trainer,
)

logger = logging.getLogger("maskops.train")

METRICS_FILE = "metrics.jsonl"
EVENTS_DIR = "events"
SUMMARY_IMAGES = 4
"""Validation images drawn into TensorBoard with ``visualize_images_summary``."""
LOG_PERIOD = 10
"""Steps between metric logs (and the device synchronisation they cost) when the spec's
logging_frequency is 0."""


def resolve_total_steps(spec: ExperimentSpec, rules: TrainingRules = TAO_RULES) -> int:
    """Optimizer steps to train for, on every rank (see the module docstring for
    ``num_epochs``; the number of ranks does not change it)."""
    if spec.num_epochs > 0:
        per_step = rules.epoch_steps_divisor * spec.accumulate_grad_steps
        return max(1, spec.resolved_total_steps // per_step)
    if spec.total_steps <= 0:
        raise TrainingError("total_steps must be > 0 (or set num_epochs)")
    return spec.total_steps


def check_num_classes(spec: ExperimentSpec, label_map: LabelMap) -> None:
    """Too few classes is an error naming the categories; too many is a warning."""
    wanted = spec.data_config.num_classes
    needed = label_map.num_classes
    if wanted < needed:
        names = ", ".join(f"{c.name} (id {c.id})" for c in label_map.categories)
        raise TrainingError(
            f"data_config.num_classes is {wanted} but the training data has "
            f"{len(label_map)} categories plus background: {names}; set num_classes to {needed}"
        )
    if wanted > needed:
        logger.warning(
            "data_config.num_classes is %d but the training data needs only %d "
            "(%d categories + background); the extra classes are never trained",
            wanted,
            needed,
            len(label_map),
        )


def build_training_model(
    spec: ExperimentSpec, *, num_classes: int, load_checkpoint: bool = True
) -> nn.Module:
    """The starting model: the pruned one, or a fresh build; then ``checkpoint`` weights
    (unless ``load_checkpoint`` is False: a resumed run loads its own)."""
    from maskops.checkpoints.model_file import CheckpointError, load_model
    from maskops.checkpoints.pretrained import load_weights_into
    from maskops.modeling import build_model

    try:
        if spec.pruned_model_path:
            model: nn.Module = load_model(spec.pruned_model_path).model
            logger.info("starting from the pruned model %s", spec.pruned_model_path)
        else:
            model = build_model(
                spec.maskrcnn_config,
                num_classes=num_classes,
                image_size=spec.data_config.image_size,
            )
        if spec.checkpoint and load_checkpoint:
            report = load_weights_into(
                model, spec.checkpoint, skip_regex=spec.skip_checkpoint_variables
            )
            logger.info("checkpoint %s: %s", spec.checkpoint, report.summary())
    except CheckpointError as exc:
        field_name = (
            "checkpoint"
            if spec.checkpoint and spec.checkpoint in str(exc)
            else ("pruned_model_path")
        )
        raise TrainingError(f"{field_name}: {exc}") from exc
    except ValueError as exc:
        raise TrainingError(str(exc)) from exc
    return model


def _infinite(make_loader: Callable[[], Any]) -> Iterator[Batch]:
    """Batches from the (endless) shard loader; a finite one is restarted."""
    while True:
        # Starting an iterator draws the workers' base seed from the global RNG: keep that
        # off the training RNG so a resumed run samples exactly like an uninterrupted one.
        with torch.random.fork_rng(devices=[]):
            iterator = iter(make_loader())
        empty = True
        for batch in iterator:
            empty = False
            yield batch
        if empty:
            raise TrainingError("the training data yielded no batches")


def _summary_images(spec: ExperimentSpec, label_map: LabelMap) -> list[torch.Tensor]:
    """The first few validation images, for ``visualize_images_summary``."""
    from maskops.data.pipeline import build_eval_loader

    loader = build_eval_loader(
        spec, label_map=label_map, batch_size=SUMMARY_IMAGES, with_masks=False
    )
    images, _ = next(iter(loader))
    return list(images)


def best_checkpoint_metric(spec: ExperimentSpec, *, custom_eval: bool = False) -> str:
    """The metric ``model.best.pth`` is kept by; a COCO metric needs val_json_file (the
    evaluation without it reports the validation loss) unless ``custom_eval`` replaces it."""
    metric = spec.resolved_best_checkpoint_metric
    if metric != VALIDATION_LOSS and not spec.data_config.val_json_file and not custom_eval:
        raise TrainingError(
            f"best_checkpoint_metric {metric!r} needs data_config.val_json_file (without it "
            f"training evaluates the validation loss: use {VALIDATION_LOSS!r})"
        )
    return metric


def _run_end(trainer: Trainer, results_dir: Path) -> RunEnd:
    """What the experiment trackers attach when the run ends (nothing after a failure):
    the model to deploy, i.e. the best checkpoint with its record, or the last checkpoint
    when no best was kept (the last one also holds the optimizer state: twice the size,
    and only a resume needs it), and metrics.jsonl."""
    if trainer.exception is not None:
        return RunEnd(failed=True)
    best = results_dir / BEST_NAME
    model = [best, results_dir / BEST_FILE] if best.is_file() else [trainer.last_checkpoint]
    candidates = [*model, results_dir / METRICS_FILE]
    return RunEnd(failed=False, artifacts=[p for p in candidates if p and p.is_file()])


def label_map_of(spec: ExperimentSpec) -> LabelMap:
    from maskops.data.manifest import load_label_map

    pattern = spec.data_config.training_file_pattern
    if not pattern:
        raise TrainingError("data_config.training_file_pattern is empty")
    try:
        return load_label_map(pattern)
    except (OSError, ValueError) as exc:
        raise TrainingError(f"data_config.training_file_pattern {pattern!r}: {exc}") from exc


def _train_rank(
    info: RankInfo,
    spec: ExperimentSpec,
    results_dir: Path,
    log_file: Path | None,
    extra_hooks: Sequence[HookBase] = (),
    eval_fn: EvalFn | None = None,
    log_every: int = LOG_PERIOD,
    tuning: DeviceTuning = DeviceTuning(),
    timeouts: GroupTimeouts = GroupTimeouts(),
) -> TrainResult | None:
    """One rank's run: its log file attached, ``tuning`` resolved for its device, and
    cuDNN's benchmark and TF32 matmul flags (the process's) set for the run and restored
    after it."""
    file_handler: logging.Handler | None = None
    if info.is_main and log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(file_handler)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    tuning = tuning.resolve(info.device)
    previous_benchmark = torch.backends.cudnn.benchmark
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    if info.device.type == "cuda":
        torch.backends.cudnn.benchmark = bool(tuning.cudnn_benchmark)
        torch.backends.cuda.matmul.allow_tf32 = bool(tuning.tf32_matmul)
    try:
        return _train(info, spec, results_dir, extra_hooks, eval_fn, log_every, tuning, timeouts)
    finally:
        torch.backends.cudnn.benchmark = previous_benchmark
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
        if file_handler is not None:
            logger.removeHandler(file_handler)
            file_handler.close()


@dataclass(frozen=True)
class _Run:
    """What the parts of one rank's run are built from."""

    info: RankInfo
    spec: ExperimentSpec
    results_dir: Path
    label_map: LabelMap
    total_steps: int
    tuning: DeviceTuning

    def log(self, message: str, *args: object) -> None:
        """Log on rank 0 only (each rank would say the same)."""
        if self.info.is_main:
            logger.info(message, *args)


def _train(
    info: RankInfo,
    spec: ExperimentSpec,
    results_dir: Path,
    extra_hooks: Sequence[HookBase],
    eval_fn: EvalFn | None,
    log_every: int,
    tuning: DeviceTuning,
    timeouts: GroupTimeouts,
) -> TrainResult | None:
    """Build the run's parts (model, optimizer, checkpointer, trainer, hooks), resume
    from the newest resumable checkpoint if any, and train; rank 0 returns the result."""
    resume_from = _resume_point(info, results_dir)
    resumed = read_training_state(resume_from) if resume_from is not None else None
    rules = _rules(info, resume_from, resumed)
    total_steps = resolve_total_steps(spec, rules)
    label_map = label_map_of(spec)
    check_num_classes(spec, label_map)
    run = _Run(info, spec, results_dir, label_map, total_steps, tuning)
    seed_everything(spec.seed)
    model = _build_model(run, load_checkpoint=resume_from is None)
    l1, l2 = _weight_decays(run, rules)
    schedule = LRSchedule.from_spec(spec, rules)
    _log_batch(run, schedule)
    optimizer = build_optimizer(
        model,
        lr=schedule(0),
        momentum=spec.momentum,
        l2_weight_decay=l2,
        fused=bool(run.tuning.fused_optimizer),
    )
    amp = AmpSettings.for_device(info.device, enabled=spec.use_amp)
    if amp.declined and info.is_main:
        logger.warning(amp.declined)
    scaler = torch.amp.GradScaler(info.device.type) if amp.needs_scaler else None
    checkpointer = Checkpointer(
        directory=results_dir,
        keep=spec.keep_checkpoints,
        model=model,
        optimizer=optimizer,
        spec=spec,
        label_map=label_map,
        scaler=scaler,
        accumulate_grad_steps=spec.accumulate_grad_steps,
        rules=rules,
    )
    start_step = _resume(run, checkpointer, resume_from, resumed)
    del resumed  # the model and optimizer hold what they need of it
    if run.tuning.graphed_backbone:
        _graph_backbone(run, model, amp)
    trainer = Trainer(
        model=_parallel(run, model),
        optimizer=optimizer,
        data=_training_batches(run, start_step),
        schedule=schedule,
        max_steps=total_steps,
        device=info.device,
        amp=amp,
        start_step=start_step,
        accumulate_grad_steps=spec.accumulate_grad_steps,
        scaler=scaler,
        l1_params=l1_regularized_parameters(model, spec.l1_weight_decay_layers) if l1 else (),
        l1_weight_decay=l1 * rules.l1_factor,
        world_size=info.world_size,
        rank=info.rank,
        clip_grad_norm=spec.global_gradient_clip_ratio,
        finite_check_period=log_every,
    )
    trainer.last_checkpoint = resume_from
    if info.is_main and start_step:
        # What the run measured before its checkpoint stays its figures: a run resumed with
        # nothing left to train (killed after its end) evaluates nothing again.
        trainer.latest_metrics.update(recorded_metrics(results_dir / METRICS_FILE, start_step))
    eval_hook = _eval_hook(run, eval_fn, amp, extra_hooks, timeouts)
    hooks = _rank_hooks(run, eval_hook)
    if info.is_main:
        hooks = _main_hooks(run, trainer, checkpointer, eval_hook, eval_fn, log_every, l2)
        hooks += [*extra_hooks]
    trainer.register_hooks(hooks)
    trainer.train()
    return _result(run, trainer)


def _resume_point(info: RankInfo, results_dir: Path) -> Path | None:
    """The newest checkpoint every rank can resume from (its RNG states are all there)."""
    resume_from = resumable_checkpoint(results_dir, info.world_size)
    newest = latest_checkpoint(results_dir)
    if info.is_main and resume_from != newest:
        logger.warning("%s lacks a rank's random state: resuming from %s", newest, resume_from)
    return resume_from


def _rules(
    info: RankInfo, resume_from: Path | None, resumed: dict[str, Any] | None
) -> TrainingRules:
    """TAO's rules for a new run; a resumed run keeps those it started with, which for a
    checkpoint of an earlier maskops are that version's (said once in the log)."""
    if resume_from is None or resumed is None:
        return TAO_RULES
    rules = checkpoint_rules(resume_from, resumed)
    changes = rules.describe_changes()
    if changes and info.is_main:
        logger.warning(
            "%s was written by an earlier maskops: the run keeps the rules it started with "
            "(%s); a new run reads these fields as TAO does (docs/tao-migration.md)",
            resume_from,
            "; ".join(changes),
        )
    return rules


def _build_model(run: _Run, *, load_checkpoint: bool) -> nn.Module:
    """The spec's model on the rank's device (pretrained weights unless resuming)."""
    model = build_training_model(
        run.spec, num_classes=run.spec.data_config.num_classes, load_checkpoint=load_checkpoint
    )
    model.to(run.info.device)
    if run.tuning.channels_last:
        model.to_channels_last()  # type: ignore[operator]
    if run.tuning.compiled_backbone:
        model.compile_backbone(run.tuning.compiled_backbone)  # type: ignore[operator]
    model.rpn.one_nms_per_batch = bool(run.tuning.one_nms_per_batch)  # type: ignore[union-attr]
    model.rpn.segmented_nms = bool(run.tuning.segmented_nms)  # type: ignore[union-attr]
    return model


def _weight_decays(run: _Run, rules: TrainingRules) -> tuple[float, float]:
    """The spec's L1 and L2 weight decays, pruned model or not (TAO's rule); only a run
    started by an earlier maskops keeps them off for a pruned model."""
    l1, l2 = run.spec.l1_weight_decay, run.spec.l2_weight_decay
    if run.spec.pruned_model_path and (l1 or l2) and not rules.pruned_weight_decay:
        run.log(
            "retraining a pruned model: l1_weight_decay %g and l2_weight_decay %g stay "
            "turned off, as when this run started",
            l1,
            l2,
        )
        return 0.0, 0.0
    return l1, l2


def _log_batch(run: _Run, schedule: LRSchedule) -> None:
    spec, world_size = run.spec, run.info.world_size
    run.log(
        "%d process(es) x batch %d x accumulate %d = %d images per step; learning rates "
        "init %g, warmup %g",
        world_size,
        spec.train_batch_size,
        spec.accumulate_grad_steps,
        world_size * spec.train_batch_size * spec.accumulate_grad_steps,
        schedule.init_learning_rate,
        schedule.warmup_learning_rate,
    )


def _resume(
    run: _Run,
    checkpointer: Checkpointer,
    resume_from: Path | None,
    resumed: dict[str, Any] | None,
) -> int:
    """Restore ``resume_from`` (read: ``resumed``; model, optimizer, scaler, this rank's
    RNG); the step it holds, or 0 for a new run."""
    if resume_from is None:
        return 0
    start_step = checkpointer.resume(resume_from, resumed)
    info = run.info
    if info.is_main:
        logger.info("resuming from %s at step %d of %d", resume_from, start_step, run.total_steps)
    elif not restore_rank_state(run.results_dir, info.rank, start_step):
        logger.warning("rank %d: no RNG state of step %d, rank 0's used", info.rank, start_step)
    return start_step


def _graph_backbone(run: _Run, model: nn.Module, amp: AmpSettings) -> None:
    """``DeviceTuning.graphed_backbone``: the backbone and FPN as CUDA graphs, for the
    spec's batch per GPU at its image size. One process, one micro-batch a step: under
    several ranks DistributedDataParallel's gradient hooks have not been tried with the
    graphs, and the gradients the backward graph returns live in its own buffers, which
    a parameter's ``.grad`` may take as they are, so the next micro-batch's replay would
    overwrite an accumulated gradient."""
    if run.info.world_size > 1 or run.spec.accumulate_grad_steps > 1:
        run.log(
            "graphed_backbone: left off (%d ranks, %d micro-batches a step; one of each)",
            run.info.world_size,
            run.spec.accumulate_grad_steps,
        )
        return
    height, width = run.spec.data_config.image_size
    channels_last = bool(run.tuning.channels_last)
    graph_backbone(
        model.backbone,  # type: ignore[arg-type]
        batch_shape=(run.spec.train_batch_size, 3, height, width),
        memory_format=torch.channels_last if channels_last else torch.contiguous_format,
        autocast_dtype=amp.dtype if amp.enabled else None,
    )
    run.log("graphed_backbone: the backbone and FPN replay as CUDA graphs")


def _parallel(run: _Run, model: nn.Module) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when there are several ranks."""
    if run.info.world_size == 1:
        return model
    device = run.info.device
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def _training_batches(run: _Run, start_step: int) -> Iterator[Batch]:
    """The endless training batches from ``start_step`` on; with ``prefetch_stream`` each
    is copied to the device one step ahead (:class:`DevicePrefetcher`)."""
    batches = _infinite(_loader_factory(run, start_step))
    if run.tuning.prefetch_stream:
        return DevicePrefetcher(batches, run.info.device)
    return batches


def _loader_factory(run: _Run, start_step: int) -> Callable[[], Any]:
    """A new train loader that starts at ``start_step``'s data position (each call: the
    loader goes round again when exhausted)."""
    from maskops.data.pipeline import build_train_loader

    def make_loader() -> Any:
        return build_train_loader(
            run.spec,
            rank=run.info.rank,
            world_size=run.info.world_size,
            start_step=start_step * run.spec.accumulate_grad_steps,
            label_map=run.label_map,
            pin_memory=bool(run.tuning.pin_memory),
            uint8_images=bool(run.tuning.uint8_images),
            compact_masks=bool(run.tuning.compact_masks),
        )

    return make_loader


def _eval_hook(
    run: _Run,
    eval_fn: EvalFn | None,
    amp: AmpSettings,
    extra_hooks: Sequence[HookBase],
    timeouts: GroupTimeouts,
) -> EvalHook:
    """Every rank evaluates its shard of the validation set
    (maskops.training.periodic_evaluation); a cancel hook, run by rank 0 only, also stops an
    evaluation on the rank it is given to."""
    eval_group = EvalGroup.create(run.info, timeouts)
    stop = cancel_check(extra_hooks)
    return EvalHook(
        run.spec.num_steps_per_eval,
        eval_fn or default_eval_fn(run.spec, run.info, amp, run.label_map, eval_group, stop),
        agree=eval_group.all_agree,
    )


def _checkpoint_period(spec: ExperimentSpec) -> int:
    return spec.save_checkpoints_steps or spec.num_steps_per_eval


def _rank_hooks(run: _Run, eval_hook: EvalHook) -> list[HookBase]:
    """The hooks of a rank other than 0: its RNG state at each checkpoint, evaluation."""
    spec, info = run.spec, run.info

    def save_state(step: int) -> Path:
        return save_rank_state(run.results_dir, info.rank, step, keep=spec.keep_checkpoints)

    return [CheckpointHook(_checkpoint_period(spec), save_state), eval_hook]


def _main_hooks(
    run: _Run,
    trainer: Trainer,
    checkpointer: Checkpointer,
    eval_hook: EvalHook,
    eval_fn: EvalFn | None,
    log_every: int,
    l2: float,
) -> list[HookBase]:
    """Rank 0's hooks: metrics, checkpoints, evaluation, the best checkpoint, early stop,
    image summaries, the writers (log, metrics.jsonl, TensorBoard, trackers), status."""
    spec, results_dir = run.spec, run.results_dir
    best_metric = best_checkpoint_metric(spec, custom_eval=eval_fn is not None)
    tensorboard = TensorBoardWriter(results_dir / EVENTS_DIR)
    events: list[MetricWriter] = [
        LogWriter(run.total_steps),
        JsonlWriter(results_dir / METRICS_FILE),
        tensorboard,
        *tracker_writers(spec, results_dir, lambda: _run_end(trainer, results_dir)),
    ]
    model = checkpointer.model
    hooks: list[HookBase] = [
        TrainingMetricsHook(log_every, l2_params=regularized_parameters(model), l2_weight_decay=l2),
        CheckpointHook(_checkpoint_period(spec), checkpointer.save),
        eval_hook,
        BestCheckpointHook(
            best_metric,
            eval_hook,
            checkpointer.save_best,
            results_dir,
            lower_is_better=best_metric == VALIDATION_LOSS,
        ),
        EarlyStopHook(target_box_ap=spec.target_box_ap, target_mask_ap=spec.target_mask_ap),
    ]
    if spec.visualize_images_summary:
        hooks.append(
            ImageSummaryHook(
                spec.num_steps_per_eval,
                tensorboard,
                lambda: _summary_images(spec, run.label_map),
                run.label_map.names,
            )
        )
    return [
        *hooks,
        WriterHook(events),
        StatusHook(results_dir / STATUS_FILE, every_steps=spec.report_frequency),
        ProgressHook(),
    ]


def _result(run: _Run, trainer: Trainer) -> TrainResult | None:
    """Rank 0's result (None on other ranks); a cancelled run raises with its checkpoint."""
    if not run.info.is_main:
        return None
    if trainer.cancelled:
        raise TrainingCancelled(trainer.iter, trainer.last_checkpoint)
    return TrainResult(
        step=trainer.iter,
        total_steps=run.total_steps,
        checkpoint=trainer.last_checkpoint,
        metrics=dict(trainer.latest_metrics),
        stop_reason=trainer.stop_reason,
    )


def run_training(
    spec: ExperimentSpec,
    results_dir: Path,
    *,
    gpus: int = 1,
    gpu_index: int = 0,
    log_file: Path | None = None,
    extra_hooks: Sequence[HookBase] = (),
    eval_fn: EvalFn | None = None,
    log_every: int | None = None,
    tuning: DeviceTuning = DeviceTuning(),
) -> TrainResult:
    """Train (or resume training) the spec's model into ``results_dir``.

    ``gpus`` > 1 starts that many ranks under torchrun (DistributedDataParallel; gloo on a
    CPU-only machine) through :func:`maskops.training.launcher.train_under_torchrun`, which
    also takes a stop request and a progress callback. ``extra_hooks`` (a
    :class:`~maskops.training.hooks.CancelHook`, a progress reporter) and ``eval_fn`` run in
    this process, so only with one rank. ``eval_fn`` replaces the periodic evaluation (COCO
    metrics when available, else validation loss). ``log_every``: steps between metric logs
    (None = the spec's logging_frequency, or every 10 steps when that is 0).
    ``tuning``: channels_last, pinned batches, cuDNN benchmark; unset switches take the
    device's defaults (:class:`~maskops.training.trainer.DeviceTuning`).

    Raises:
        TrainingError: bad input or a non-finite loss (one line, naming what is wrong).
        TrainingCancelled: a cancel hook fired; its checkpoint holds the last step.
    """
    if gpus < 1:
        raise TrainingError(f"--gpus must be >= 1, got {gpus}")
    if gpus > 1 and torchrun_env() is None:
        if extra_hooks or eval_fn is not None or tuning != DeviceTuning():
            raise TrainingError(
                "extra_hooks, eval_fn and tuning apply in this process: with gpus > 1 "
                "the ranks run under torchrun (use maskops.training.launcher)"
            )
        from maskops.training.launcher import RankPlan, train_under_torchrun

        plan = RankPlan(nproc_per_node=gpus, gpu_index=gpu_index)
        return train_under_torchrun(spec, results_dir, plan, log_file=log_file, log_every=log_every)
    result = train_this_rank(
        spec,
        results_dir,
        gpu_index=gpu_index,
        log_file=log_file,
        extra_hooks=extra_hooks,
        eval_fn=eval_fn,
        log_every=log_every,
        tuning=tuning,
    )
    assert result is not None, "rank 0 returns the result"
    return result


def train_this_rank(
    spec: ExperimentSpec,
    results_dir: Path,
    *,
    gpu_index: int = 0,
    log_file: Path | None = None,
    extra_hooks: Sequence[HookBase] = (),
    eval_fn: EvalFn | None = None,
    log_every: int | None = None,
    tuning: DeviceTuning = DeviceTuning(),
    timeouts: GroupTimeouts = GroupTimeouts(),
) -> TrainResult | None:
    """This process's rank of the run (torchrun's, else rank 0 of 1): rank 0 returns the
    result, the others None. ``timeouts``: how long the ranks wait for each other.
    ``extra_hooks`` run on rank 0 only; a :class:`~maskops.training.hooks.CancelHook` among
    them also stops an evaluation on any rank it is given to (give it to every rank). Other
    arguments as :func:`run_training`'s."""
    if log_every is None:
        log_every = spec.logging_frequency or LOG_PERIOD
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    env = torchrun_env()
    if env is not None and env[1] > 1 and env[0] == 0 and not torch.cuda.is_available():
        logger.info("no CUDA device: %d processes train on the CPU with the gloo backend", env[1])
    try:
        check_trackers(spec)
        return run_rank(
            _train_rank,
            gpu_index=gpu_index,
            timeouts=timeouts,
            args=(spec, results_dir, log_file),
            kwargs={
                "extra_hooks": tuple(extra_hooks),
                "eval_fn": eval_fn,
                "log_every": log_every,
                "tuning": tuning,
                "timeouts": timeouts,
            },
        )
    except (TrainingError, RuntimeError) as exc:
        if env is None or env[0] == 0:
            _record_failure(results_dir / STATUS_FILE, exc)
        raise


def _record_failure(status: Path, exc: BaseException) -> None:
    """A failure before the loop started has no status yet: record it for the worker."""
    try:
        state = json.loads(status.read_text()).get("state")
    except (OSError, ValueError):
        state = None
    if state != "failed":
        write_json_atomic(status, {"state": "failed", "error": str(exc)})
