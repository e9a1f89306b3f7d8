"""End-to-end training runs on the demo shards (resnet10, 128x128, a few steps each)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from maskops.checkpoints.model_file import load_model, read_checkpoint
from maskops.checkpoints.run_directory import checkpoint_path, list_checkpoints
from maskops.cli.main import main as cli_main
from maskops.data.manifest import load_label_map
from maskops.modeling import build_model, prunable_convs
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec
from maskops.training import CancelHook, HookBase, TrainingCancelled, TrainingError, run_training
from maskops.training.launcher import RankPlan, torchrun_command, train_under_torchrun
from maskops.training.optim import regularized_parameters
from maskops.training.rules import TAO_RULES
from maskops.training.schedule import LRSchedule
from maskops.training.seeding import seed_everything
from maskops.training.train import build_training_model, check_num_classes

SpecFactory = Callable[..., ExperimentSpec]


def _metrics(results_dir: Path) -> list[dict[str, Any]]:
    lines = (results_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _status(results_dir: Path) -> dict[str, Any]:
    status: dict[str, Any] = json.loads((results_dir / "status.json").read_text())
    return status


def _initial_weights(spec: ExperimentSpec) -> dict[str, torch.Tensor]:
    """The weights run_training starts from (it seeds with spec.seed, then builds)."""
    seed_everything(spec.seed)
    model = build_model(
        spec.maskrcnn_config,
        num_classes=spec.data_config.num_classes,
        image_size=spec.data_config.image_size,
    )
    return model.state_dict()


class _LayoutProbe(HookBase):
    """Records whether the convolutions train channels_last (the CPU default)."""

    def before_train(self) -> None:
        convs = [m for m in self.trainer.unwrapped.modules() if isinstance(m, torch.nn.Conv2d)]
        self.channels_last = [
            c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs
        ]


def test_demo_data_trains_to_decreasing_loss(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(total_steps=12, l1_weight_decay=1e-6, data_config={"val_json_file": ""})
    probe = _LayoutProbe()
    result = run_training(spec, tmp_path, log_every=1, extra_hooks=[probe])

    assert result.step == 12 and result.checkpoint == tmp_path / "model.step-12.pth"
    assert probe.channels_last and all(probe.channels_last)
    records = [r for r in _metrics(tmp_path) if "Total loss" in r]
    assert [r["step"] for r in records] == list(range(1, 13))
    for name in (
        "RPN score loss",
        "RPN box loss",
        "FastRCNN class loss",
        "FastRCNN box loss",
        "Mask loss",
        "L2 loss",
        "L1 loss",
        "learning rate",
        "samples/sec",
    ):
        assert name in records[-1], name

    def mean(window: list[dict[str, Any]], *names: str) -> float:
        return sum(r[n] for r in window for n in names) / len(window)

    # The classification losses fall fastest; the box losses first grow, as proposals and
    # detections start to be foreground, so the total falls less in so few steps.
    scores = ("RPN score loss", "FastRCNN class loss")
    assert mean(records[-4:], *scores) < 0.75 * mean(records[:4], *scores)
    assert mean(records[-4:], "Total loss") < 0.9 * mean(records[:4], "Total loss")
    # The logged learning rate is the schedule's (warmup over 2 steps, then init).
    schedule = LRSchedule.from_spec(spec)
    assert [r["learning rate"] for r in records] == pytest.approx([schedule(s) for s in range(12)])
    # End-of-training validation (loss: no val_json_file), status and TensorBoard events.
    assert "val/Total loss" in result.metrics
    status = _status(tmp_path)
    assert status["state"] == "succeeded" and status["step"] == status["total_steps"] == 12
    assert status["metrics"]["Total loss"] == records[-1]["Total loss"]
    assert list((tmp_path / "events").glob("events.out.tfevents.*"))
    loaded = load_model(result.checkpoint)
    assert loaded.step == 12
    assert loaded.label_map == load_label_map(spec.data_config.training_file_pattern)


class _Crash(Exception):
    pass


class _CrashAt(HookBase):
    """Dies in the middle of a run, after a checkpoint, like a killed process would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self) -> None:
        if self.trainer.iter == self.step:
            raise _Crash


def test_resume_after_crash_equals_uninterrupted_run(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    # Validation (loss, which samples RoIs at random) runs at steps 2 and 4: it must not
    # disturb the training RNG, or the resumed run would diverge.
    spec = spec_factory(total_steps=4, num_steps_per_eval=2, data_config={"val_json_file": ""})
    straight = run_training(spec, tmp_path / "straight", log_every=1)

    resumed_dir = tmp_path / "resumed"
    with pytest.raises(_Crash):
        run_training(spec, resumed_dir, extra_hooks=[_CrashAt(3)], log_every=1)
    assert [step for step, _ in list_checkpoints(resumed_dir)] == [2]
    assert _status(resumed_dir)["state"] == "failed"
    resumed = run_training(spec, resumed_dir, log_every=1)

    assert resumed.step == straight.step == 4
    a = read_checkpoint(straight.checkpoint)  # type: ignore[arg-type]
    b = read_checkpoint(resumed.checkpoint)  # type: ignore[arg-type]
    assert a["data_position"] == b["data_position"] == 4
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for pa, pb in zip(
        a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True
    ):
        torch.testing.assert_close(pb["momentum_buffer"], pa["momentum_buffer"])
    lr_a = [r["learning rate"] for r in _metrics(tmp_path / "straight") if "learning rate" in r]
    lr_b = {r["step"]: r["learning rate"] for r in _metrics(resumed_dir) if "learning rate" in r}
    assert [lr_b[s] for s in range(1, 5)] == lr_a


def test_a_run_resumed_at_its_end_reports_what_it_measured(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    # A run killed after its last checkpoint and evaluation resumes with nothing to train:
    # it evaluates nothing again, and still reports its figures (an AutoML trial's metric).
    spec = spec_factory(total_steps=2, num_steps_per_eval=2, data_config={"val_json_file": ""})
    first = run_training(spec, tmp_path, log_every=1)
    again = run_training(spec, tmp_path, log_every=1)
    assert again.step == first.step == 2 and "val/Total loss" in first.metrics
    assert again.metrics == first.metrics
    # A torn last line (a crash while writing it) is skipped.
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 2, "val/Total lo')
    assert run_training(spec, tmp_path, log_every=1).metrics == first.metrics


def test_cancel_stops_at_step_boundary_with_checkpoint(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    calls = itertools.count()
    spec = spec_factory(data_config={"val_json_file": ""})
    with pytest.raises(TrainingCancelled) as info:
        run_training(spec, tmp_path, extra_hooks=[CancelHook(lambda: next(calls) >= 1)])
    assert info.value.step == 1
    assert info.value.checkpoint == tmp_path / "model.step-1.pth"
    assert load_model(info.value.checkpoint).step == 1
    status = _status(tmp_path)
    assert status["state"] == "cancelled" and status["step"] == 1


def test_non_finite_loss_stops_naming_the_step(spec_factory: SpecFactory, tmp_path: Path) -> None:
    spec = spec_factory(
        total_steps=6,
        init_learning_rate=1e6,
        warmup_steps=0,
        num_steps_per_eval=1,
        data_config={"val_json_file": ""},
    )
    with pytest.raises(TrainingError, match=r"non-finite loss at step \d+") as info:
        run_training(spec, tmp_path, eval_fn=lambda model, step: {})
    failed_step = int(str(info.value).split("step ")[1].split()[0])
    saved = list_checkpoints(tmp_path)
    # Every checkpoint predates the failing step and holds finite weights.
    assert [step for step, _ in saved] == list(range(1, failed_step))
    for _, path in saved:
        weights = read_checkpoint(path)["model"]
        assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    status = _status(tmp_path)
    assert status["state"] == "failed" and f"step {failed_step}" in status["error"]


def test_freeze_blocks_and_freeze_bn_stay_bit_identical(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    spec = spec_factory(
        total_steps=2,
        warmup_steps=0,
        maskrcnn_config={"freeze_blocks": [0, 1], "freeze_bn": True},
        data_config={"val_json_file": ""},
    )
    initial = _initial_weights(spec)
    result = run_training(spec, tmp_path, eval_fn=lambda model, step: {})
    trained = read_checkpoint(result.checkpoint)["model"]  # type: ignore[arg-type]

    frozen_prefixes = ("backbone.body.conv1.", "backbone.body.bn1.", "backbone.body.layer1.")
    frozen_bn = [k for k in initial if k.startswith("backbone.body.") and ".bn" in k]
    checked = [k for k in initial if k.startswith(frozen_prefixes)] + frozen_bn
    assert checked
    for key in checked:
        assert torch.equal(trained[key], initial[key]), key
    # The rest did train: the test would notice a run that changed nothing.
    assert not torch.equal(
        trained["backbone.body.layer2.0.conv1.weight"],
        initial["backbone.body.layer2.0.conv1.weight"],
    )


def test_skip_checkpoint_variables_keep_matching_layers_at_init(
    spec_factory: SpecFactory, tiny_checkpoint: Path
) -> None:
    skip = r"roi_heads\.box_predictor|rpn\.head\.cls_logits"
    spec = spec_factory(checkpoint=str(tiny_checkpoint), skip_checkpoint_variables=skip)
    initial = _initial_weights(spec)
    seed_everything(spec.seed)
    model = build_training_model(spec, num_classes=spec.data_config.num_classes)
    loaded = model.state_dict()
    source = read_checkpoint(tiny_checkpoint)["model"]

    skipped = [k for k in loaded if "box_predictor" in k or "rpn.head.cls_logits" in k]
    assert len(skipped) == 6
    for key in skipped:
        assert torch.equal(loaded[key], initial[key]), key
        assert not torch.equal(loaded[key], source[key]), key
    for key in ("backbone.body.conv1.weight", "roi_heads.mask_predictor.mask_fcn_logits.weight"):
        assert torch.equal(loaded[key], source[key]), key


@pytest.mark.parametrize("layers", ["all", "prunable"])
def test_l1_penalty_pulls_kernels_towards_zero(
    spec_factory: SpecFactory, tmp_path: Path, layers: str
) -> None:
    lr, l1 = 0.01, 1e-3
    common: dict[str, Any] = {
        "total_steps": 1,
        "warmup_steps": 0,
        "init_learning_rate": lr,
        "data_config": {"val_json_file": ""},
    }
    plain = run_training(spec_factory(**common), tmp_path / "plain", eval_fn=lambda m, s: {})
    with_l1 = run_training(
        spec_factory(l1_weight_decay=l1, l1_weight_decay_layers=layers, **common),
        tmp_path / "l1",
        eval_fn=lambda m, s: {},
    )
    spec = spec_factory(**common)
    initial = _initial_weights(spec)
    a = read_checkpoint(plain.checkpoint)["model"]  # type: ignore[arg-type]
    b = read_checkpoint(with_l1.checkpoint)["model"]  # type: ignore[arg-type]
    model = build_model(spec.maskrcnn_config, num_classes=4, image_size=(128, 128))
    kernel_ids = {id(p) for p in regularized_parameters(model)}
    kernels = [n for n, p in model.named_parameters() if id(p) in kernel_ids]
    prunable = {f"{name}.weight" for name in prunable_convs(model)}
    penalised = set(kernels) if layers == "all" else prunable
    assert penalised and any(name.startswith("roi_heads.") for name in kernels)
    for name in kernels:
        # First SGD step: the update is lr * grad, and TAO's L1 penalty,
        # l1_weight_decay / 2 * sum(|w|), adds l1 / 2 * sign(w) to the grad.
        step = lr * l1 / 2 * torch.sign(initial[name])
        expected = a[name] - step if name in penalised else a[name]
        torch.testing.assert_close(b[name], expected, rtol=0, atol=1e-6, msg=name)
    assert with_l1.metrics["L1 loss"] > 0 and "L1 loss" not in plain.metrics


def test_num_classes_too_small_names_categories(
    spec_factory: SpecFactory, caplog: pytest.LogCaptureFixture
) -> None:
    label_map = load_label_map(spec_factory().data_config.training_file_pattern)
    with pytest.raises(TrainingError, match=r"circle.*square.*triangle.*set num_classes to 4"):
        check_num_classes(spec_factory(data_config={"num_classes": 3}), label_map)
    with caplog.at_level(logging.WARNING, logger="maskops.train"):
        check_num_classes(spec_factory(data_config={"num_classes": 6}), label_map)
    assert "needs only 4" in caplog.text


def test_early_stop_on_target_ap_with_image_summaries(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = spec_factory(
        total_steps=5,
        num_steps_per_eval=1,
        target_box_ap=0.5,
        target_mask_ap=0.5,
        keep_checkpoints=1,
        visualize_images_summary=True,
    )

    def rising_ap(model: torch.nn.Module, step: int) -> dict[str, float]:
        return {"AP": 0.3 * step, "mask_AP": 0.3 * step}

    result = run_training(spec, tmp_path, eval_fn=rising_ap)
    assert result.step == 2 and result.stop_reason and "AP" in result.stop_reason
    assert _status(tmp_path)["state"] == "stopped"
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]  # keep_checkpoints 1
    events = EventAccumulator(str(tmp_path / "events"), size_guidance={"images": 0})
    events.Reload()
    assert set(events.Tags()["images"]) == {f"val_images/{i}" for i in range(4)}
    assert [e.step for e in events.Images("val_images/0")] == [1, 2]
    assert [e.value for e in events.Scalars("AP")] == pytest.approx([0.3, 0.6])


def test_torchrun_commands_for_one_host_and_for_a_host_of_several() -> None:
    args = ["--spec", "s.json"]
    one = torchrun_command(RankPlan(nproc_per_node=2, max_restarts=3), args)
    assert one[1:] == [
        "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=3",
        "--monitor-interval=1", "--standalone", "-m", "maskops.training.rank_main", *args,
    ]  # fmt: skip
    plan = RankPlan(nproc_per_node=4, nnodes=2, rdzv_endpoint="h0:29400", rdzv_id="job-7")
    several = torchrun_command(plan, args)
    assert "--standalone" not in several and plan.world_size == 8
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h0:29400"} < set(several)
    assert {"--rdzv-id=job-7", "--rdzv-conf=join_timeout=600"} < set(several)
    with pytest.raises(TrainingError, match="2 hosts need a rendezvous endpoint"):
        RankPlan(nnodes=2)


def test_two_hosts_on_loopback_gather_through_the_c10d_rendezvous(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    """Two torchrun agents (two "hosts" of one rank each) with the same endpoint and run id
    form one two-rank run writing one results folder, as on shared storage. As in TAO,
    the rates are the spec's and num_examples_per_epoch is per GPU: 4 images at batch 2
    are two steps on each rank, whatever the number of ranks."""
    spec = spec_factory(
        num_epochs=1,
        num_examples_per_epoch=4,
        warmup_steps=0,
        logging_frequency=1,
        data_config={"val_json_file": ""},
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plan = RankPlan(nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="loopback")
    with ThreadPoolExecutor(2) as pool:
        hosts = [pool.submit(train_under_torchrun, spec, tmp_path, plan) for _ in range(2)]
        results = [host.result(timeout=300) for host in hosts]
    assert [r.step for r in results] == [2, 2]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]
    records = [r for r in _metrics(tmp_path) if "learning rate" in r]
    assert [r["learning rate"] for r in records] == pytest.approx([0.004] * 2)  # as written
    state = read_checkpoint(checkpoint_path(tmp_path, 2))
    assert state["scheduler"]["rules"] == TAO_RULES.to_state()


def test_a_rank_error_fails_the_run_naming_the_rank(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    """Both ranks start under torchrun (the path --gpus 2 takes) and fail on the input: the
    run fails with the rank's one-line error. (Two ranks training, a SIGKILLed rank, cancel
    and resume: tests/integration/api/test_multi_rank.py.)"""
    spec = spec_factory(total_steps=1, data_config={"training_file_pattern": "/nowhere/train*"})
    with pytest.raises(TrainingError, match=r"^rank \d: .*training_file_pattern"):
        run_training(spec, tmp_path, gpus=2)
    assert _status(tmp_path)["state"] == "failed"


def test_cli_resolves_spec_paths_and_reports_bad_input(
    spec_factory: SpecFactory,
    tmp_path: Path,
    demo_shards: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    relative = os.path.relpath(demo_shards, tmp_path)
    spec = spec_factory(
        total_steps=1,
        data_config={
            "training_file_pattern": f"{relative}/train*",
            "validation_file_pattern": f"{relative}/val*",
            "val_json_file": "",
        },
    )
    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_to_text(spec))
    results = tmp_path / "results"
    cwd = Path.cwd()
    assert cli_main(["train", "-e", str(spec_file), "-d", str(results)]) == 0
    assert Path.cwd() == cwd
    assert "training finished at step 1/1" in capsys.readouterr().out
    assert (results / "model.step-1.pth").is_file()

    broken = tmp_path / "broken.txt"
    broken.write_text(spec_to_text(spec).replace("nlayers: 10", "nlayers: 42"))
    assert cli_main(["train", "-e", str(broken), "-d", str(results)]) == 2
    assert "nlayers" in capsys.readouterr().err
