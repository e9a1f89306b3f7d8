"""The device switches that change how batches reach the device train to the same losses.

``prefetch_stream`` passes batches through on a CPU, so a run with it must compute exactly
the losses of one without; ``compact_masks`` crops each mask to its box, and the mask head's
targets, hence the losses, stay equal within float rounding; ``one_nms_per_batch`` and
``segmented_nms`` keep the same proposals. On a GPU the prefetcher's copy must overlap the
compute stream's work, and the backbone replayed as CUDA graphs trains to the eager losses
(``gpu`` marked).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import pytest
import torch

from maskops.data.pipeline import build_train_loader
from maskops.spec.models import ExperimentSpec
from maskops.training import HookBase, run_training
from maskops.training.prefetch import DevicePrefetcher, batch_tensors
from maskops.training.trainer import DeviceTuning

SpecFactory = Callable[..., ExperimentSpec]
STEPS = 2


class _Losses(HookBase):
    """Every step's losses, by TAO name."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def after_step(self) -> None:
        self.steps.append({k: float(v) for k, v in self.trainer.last_losses.items()})


def _losses(spec: ExperimentSpec, root: Path, tuning: DeviceTuning) -> list[dict[str, float]]:
    out = root / f"run-{len(list(root.iterdir()))}"
    probe = _Losses()
    run_training(spec, out, extra_hooks=[probe], eval_fn=lambda model, step: {}, tuning=tuning)
    shutil.rmtree(out)
    return probe.steps


@pytest.fixture(scope="module")
def short_spec(tiny_spec: ExperimentSpec) -> ExperimentSpec:
    data = tiny_spec.model_dump()
    data.update(total_steps=STEPS, num_steps_per_eval=0)
    return ExperimentSpec.model_validate(data)


@pytest.fixture(scope="module")
def default_losses(
    short_spec: ExperimentSpec, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, float]]:
    return _losses(short_spec, tmp_path_factory.mktemp("default"), DeviceTuning())


def test_prefetched_batches_are_the_loaders_in_order(short_spec: ExperimentSpec) -> None:
    expected = list(islice(build_train_loader(short_spec), 3))
    prefetched = DevicePrefetcher(iter(build_train_loader(short_spec)), torch.device("cpu"))
    for (images, targets), got in zip(expected, islice(prefetched, 3), strict=True):
        assert [t["image_id"] for t in targets] == [t["image_id"] for t in got[1]]
        ours, theirs = batch_tensors((images, targets)), batch_tensors(got)
        assert len(ours) == len(theirs) and all(map(torch.equal, ours, theirs))
    finite = DevicePrefetcher(iter(expected), torch.device("cpu"))
    assert len(list(finite)) == len(expected)


def test_a_run_through_the_prefetcher_trains_to_identical_losses(
    short_spec: ExperimentSpec, default_losses: list[dict[str, float]], tmp_path: Path
) -> None:
    prefetched = _losses(short_spec, tmp_path, DeviceTuning(prefetch_stream=True))
    assert len(default_losses) == STEPS and prefetched == default_losses


def test_a_run_on_compact_masks_trains_to_the_same_losses(
    short_spec: ExperimentSpec, default_losses: list[dict[str, float]], tmp_path: Path
) -> None:
    compact = _losses(short_spec, tmp_path, DeviceTuning(compact_masks=True))
    assert [list(step) for step in compact] == [list(step) for step in default_losses]
    assert all(step["Mask loss"] > 0 for step in compact)
    for ours, theirs in zip(compact, default_losses, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "nms", [DeviceTuning(one_nms_per_batch=True), DeviceTuning(segmented_nms=True)],
    ids=["one_nms_per_batch", "segmented_nms"],
)  # fmt: skip
def test_a_run_with_the_rpn_nms_done_another_way_trains_to_the_same_losses(
    short_spec: ExperimentSpec,
    default_losses: list[dict[str, float]],
    tmp_path: Path,
    nms: DeviceTuning,
) -> None:
    losses = _losses(short_spec, tmp_path, nms)
    assert len(losses) == STEPS
    for ours, theirs in zip(losses, default_losses, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)


@pytest.mark.gpu
def test_the_next_batch_copies_while_the_compute_stream_is_busy() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = torch.device("cuda", 0)
    host = [
        ([torch.rand(3, 256, 256).pin_memory()], [{"boxes": torch.rand(4, 4).pin_memory()}])
        for _ in range(3)
    ]
    prefetcher = DevicePrefetcher(iter(host), device)
    first = next(prefetcher)  # the second batch's copy is now issued on the side stream
    assert torch.equal(first[0][0].cpu(), host[0][0][0])
    torch.cuda.synchronize(device)
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time on the compute stream
    second = next(prefetcher)  # waits for the copy issued above, issues the third's
    assert prefetcher.stream is not None
    copied = torch.cuda.Event()
    copied.record(prefetcher.stream)
    copied.synchronize()  # the third batch's copy is done...
    assert not torch.cuda.current_stream(device).query()  # ...while the compute stream sleeps
    assert torch.equal(second[0][0].cpu(), host[1][0][0])
    third = next(prefetcher)
    assert torch.equal(third[1][0]["boxes"].cpu(), host[2][1][0]["boxes"])
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_the_graphed_backbone_is_cudas_alone_and_never_beside_a_compiled_one() -> None:
    from maskops.modeling import build_model
    from maskops.spec.models import MaskRCNNConfig
    from maskops.training.graphed import graph_backbone

    on_cpu = DeviceTuning(graphed_backbone=True).resolve(torch.device("cpu"))
    assert on_cpu.graphed_backbone is False
    with pytest.raises(ValueError, match="choose one"):
        DeviceTuning(graphed_backbone=True, compiled_backbone="default")
    model = build_model(MaskRCNNConfig(nlayers=10), num_classes=3, image_size=(64, 64))
    with pytest.raises(RuntimeError, match="on a CUDA device"):
        graph_backbone(
            model.backbone,
            batch_shape=(1, 3, 64, 64),
            memory_format=torch.contiguous_format,
            autocast_dtype=None,
        )


@pytest.mark.gpu
def test_a_run_with_the_graphed_backbone_trains_to_the_eager_losses(
    short_spec: ExperimentSpec, default_losses: list[dict[str, float]], tmp_path: Path
) -> None:
    """The first step's losses come before any update (the capture's batch-norm changes
    are undone); the second follows one update by the graphs' gradients."""
    graphed = _losses(short_spec, tmp_path, DeviceTuning(graphed_backbone=True))
    assert [list(step) for step in graphed] == [list(step) for step in default_losses]
    for ours, theirs in zip(graphed, default_losses, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-3, abs=1e-5)
