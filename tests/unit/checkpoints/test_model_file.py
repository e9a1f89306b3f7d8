"""Checkpoint format: atomic save, safe load, pruned rebuild, foreign weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

from maskops.checkpoints.model_file import (
    CheckpointError,
    load_model,
    read_checkpoint,
    save_checkpoint,
)
from maskops.checkpoints.pretrained import load_weights_into
from maskops.data.labels import LabelMap
from maskops.modeling import SpecMaskRCNN, build_model
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

IMAGE_SIZE = (128, 128)
LABELS = LabelMap.from_coco_categories([{"id": 7, "name": "circle"}, {"id": 3, "name": "square"}])


def _spec(config: MaskRCNNConfig) -> ExperimentSpec:
    return ExperimentSpec(
        data_config=DataConfig(image_size=IMAGE_SIZE, num_classes=3), maskrcnn_config=config
    )


def _detect(model: SpecMaskRCNN, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model.eval()
    with torch.no_grad():
        out = model(images)
    assert isinstance(out, list)
    return out[0]


def test_round_trip_gives_the_same_outputs_and_state(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    config = tiny_config(freeze_blocks=[0], min_level=3, max_level=6, mrcnn_resolution=16)
    model = build_model(config, num_classes=LABELS.num_classes, image_size=IMAGE_SIZE)
    images = [torch.rand(3, *IMAGE_SIZE)]
    expected = _detect(model, images)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng_state = torch.get_rng_state()
    path = save_checkpoint(
        tmp_path / "run" / "model.step-5.pth",
        model=model,
        spec=_spec(config),
        label_map=LABELS,
        step=5,
        optimizer=optimizer.state_dict(),
        rng={"torch": rng_state},
        data_position=[3, 1],
    )
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["model.step-5.pth"]  # no temp file left

    loaded = load_model(path)
    assert loaded.step == 5
    assert loaded.label_map == LABELS
    assert loaded.spec.maskrcnn_config == config
    assert not loaded.model.training
    assert set(loaded.training_state) == {"optimizer", "rng", "data_position"}
    assert torch.equal(loaded.training_state["rng"]["torch"], rng_state)
    got = _detect(loaded.model, images)
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    # Frozen blocks stay frozen after a reload.
    assert not loaded.model.backbone.body.conv1.weight.requires_grad


def test_save_is_atomic_and_refuses_unloadable_state(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    config = tiny_config()
    model = build_model(config, num_classes=3, image_size=IMAGE_SIZE)
    path = tmp_path / "last.pth"
    save_checkpoint(path, model=model, spec=_spec(config), label_map=LABELS, step=1)
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"checkpoint field rng\['numpy'\] is a object"):
        save_checkpoint(
            path,
            model=model,
            spec=_spec(config),
            label_map=LABELS,
            step=2,
            rng={"numpy": object()},
        )
    with pytest.raises(TypeError, match=r"checkpoint field scheduler\['lr'\] is a float64"):
        save_checkpoint(
            path,
            model=model,
            spec=_spec(config),
            label_map=LABELS,
            step=2,
            scheduler={"lr": np.float64(0.1)},
        )
    with pytest.raises(TypeError, match="reserved"):
        save_checkpoint(
            path, model=model, spec=_spec(config), label_map=LABELS, step=2, **{"format": 1}
        )
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pth"]
    # Overwriting replaces the whole file.
    save_checkpoint(path, model=model, spec=_spec(config), label_map=LABELS, step=9)
    assert read_checkpoint(path)["step"] == 9


def test_ddp_prefixes_are_stripped(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    config = tiny_config()
    model = build_model(config, num_classes=3, image_size=IMAGE_SIZE)
    wrapper = torch.nn.Module()
    wrapper.module = model  # what DistributedDataParallel's state_dict looks like
    path = save_checkpoint(
        tmp_path / "c.pth", model=wrapper, spec=_spec(config), label_map=LABELS, step=0
    )
    assert set(read_checkpoint(path)["model"]) == set(model.state_dict())


def test_unusable_files_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"missing\.pth: no such file"):
        load_model(tmp_path / "missing.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage\.pth: not a readable weights file"):
        load_model(garbage)
    foreign = tmp_path / "foreign.pth"
    torch.save({"conv.weight": torch.zeros(1)}, foreign)
    with pytest.raises(CheckpointError, match=r"foreign\.pth: not a maskops checkpoint"):
        load_model(foreign)
    future = tmp_path / "future.pth"
    torch.save({"format": "maskops", "version": 99}, future)
    with pytest.raises(CheckpointError, match="version 99 is not supported"):
        load_model(future)
    # Pickled code is refused by the weights-only loader instead of being run.
    evil = tmp_path / "evil.pth"
    torch.save({"format": "maskops", "version": 1, "x": Path("/")}, evil)
    with pytest.raises(CheckpointError, match=r"evil\.pth: not a readable weights file"):
        load_model(evil)


def test_pruned_state_dict_rebuilds_and_runs(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    config = tiny_config()
    model = build_model(config, num_classes=3, image_size=IMAGE_SIZE)
    state = model.state_dict()
    # Prune layer1.0's inner channels 64 -> 40 by hand, as a structured pruner would:
    # conv1's outputs, bn1 and conv2's inputs shrink together.
    keep = torch.arange(40)
    prefix = "backbone.body.layer1.0."
    state[prefix + "conv1.weight"] = state[prefix + "conv1.weight"][keep]
    for name in ("weight", "bias", "running_mean", "running_var"):
        state[prefix + "bn1." + name] = state[prefix + "bn1." + name][keep]
    state[prefix + "conv2.weight"] = state[prefix + "conv2.weight"][:, keep]
    # The box head's hidden width 64 -> 24 (fc6 outputs, fc7 inputs).
    state["roi_heads.box_head.fc6.weight"] = state["roi_heads.box_head.fc6.weight"][:24]
    state["roi_heads.box_head.fc6.bias"] = state["roi_heads.box_head.fc6.bias"][:24]
    state["roi_heads.box_head.fc7.weight"] = state["roi_heads.box_head.fc7.weight"][:, :24]
    with pytest.raises(RuntimeError):  # the unpruned architecture cannot hold it
        model.load_state_dict(state)

    path = tmp_path / "pruned.pth"
    torch.save(
        {
            "format": "maskops",
            "version": 1,
            "model": state,
            "spec": _spec(config).model_dump(mode="json"),
            "label_map": LABELS.to_json(),
            "step": 0,
        },
        path,
    )
    loaded = load_model(path)
    body = loaded.model.backbone.body
    assert body.layer1[0].conv1.out_channels == 40
    assert body.layer1[0].bn1.num_features == 40
    assert body.layer1[0].conv2.in_channels == 40
    assert loaded.model.roi_heads.box_head.fc6.out_features == 24
    for key, value in state.items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    out = _detect(loaded.model, [torch.rand(3, *IMAGE_SIZE)])
    assert out["boxes"].shape[0] > 0
    # ... and it trains.
    loaded.model.train()
    target = {
        "boxes": torch.tensor([[10.0, 10.0, 60.0, 70.0]]),
        "labels": torch.tensor([1]),
        "masks": torch.ones((1, *IMAGE_SIZE), dtype=torch.uint8),
    }
    losses = loaded.model([torch.rand(3, *IMAGE_SIZE)], [target])
    torch.stack(list(losses.values())).sum().backward()
    assert body.layer1[0].conv1.weight.grad is not None


def _torchvision_resnet18_maskrcnn() -> MaskRCNN:
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    return MaskRCNN(backbone, num_classes=91)


def test_torchvision_state_dict_loads_with_skip_regex(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    torch.manual_seed(1)
    reference = _torchvision_resnet18_maskrcnn()
    path = tmp_path / "maskrcnn_resnet18_fpn.pth"
    torch.save(reference.state_dict(), path)

    torch.manual_seed(2)
    model = build_model(
        tiny_config(nlayers=18, fast_rcnn_mlp_head_dim=1024), num_classes=3, image_size=IMAGE_SIZE
    )
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    report = load_weights_into(model, path, skip_regex=r"^roi_heads\.mask_head\.")

    source, now = reference.state_dict(), model.state_dict()
    assert report.loaded and not report.unexpected and not report.missing
    for key in report.loaded:
        assert torch.equal(now[key], source[key]), key
    # Skipped by regex: left at initialisation.
    assert report.skipped_by_regex == [k for k in now if k.startswith("roi_heads.mask_head.")]
    for key in report.skipped_by_regex:
        assert torch.equal(now[key], initial[key]), key
    # 91 COCO classes vs 3 here: the predictors' class layers differ and are reported.
    mismatched = {key for key, _, _ in report.shape_mismatch}
    assert mismatched == {
        "roi_heads.box_predictor.cls_score.weight",
        "roi_heads.box_predictor.cls_score.bias",
        "roi_heads.box_predictor.bbox_pred.weight",
        "roi_heads.box_predictor.bbox_pred.bias",
        "roi_heads.mask_predictor.mask_fcn_logits.weight",
        "roi_heads.mask_predictor.mask_fcn_logits.bias",
    }
    for key in mismatched:
        assert torch.equal(now[key], initial[key]), key
    assert "loaded" in report.summary()


def test_imagenet_resnet_and_training_checkpoint_shapes_load(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    resnet = torchvision.models.resnet18(weights=None)
    plain = tmp_path / "resnet18.pth"
    torch.save(resnet.state_dict(), plain)
    model = build_model(tiny_config(nlayers=18), num_classes=3, image_size=IMAGE_SIZE)
    report = load_weights_into(model, plain)
    assert all(k.startswith("backbone.body.") for k in report.loaded)
    assert torch.equal(model.backbone.body.layer4[1].conv2.weight, resnet.layer4[1].conv2.weight)
    assert not report.unexpected  # fc.* is dropped, not reported as foreign

    wrapped = tmp_path / "train_state.pth"
    torch.save(
        {"model": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 3}, wrapped
    )
    other = build_model(tiny_config(nlayers=18), num_classes=3, image_size=IMAGE_SIZE)
    report = load_weights_into(other, wrapped)
    assert not report.missing and not report.shape_mismatch
    assert torch.equal(
        other.backbone.fpn.inner_blocks[0][0].weight, model.backbone.fpn.inner_blocks[0][0].weight
    )


def test_load_weights_into_rejects_bad_regex_and_unrelated_files(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    model = build_model(tiny_config(), num_classes=3, image_size=IMAGE_SIZE)
    unrelated = tmp_path / "unrelated.pth"
    torch.save({"encoder.weight": torch.zeros(3)}, unrelated)
    with pytest.raises(CheckpointError, match=r"unrelated\.pth: no tensor in it matches the model"):
        load_weights_into(model, unrelated)
    with pytest.raises(ValueError, match="skip_checkpoint_variables: invalid regex"):
        load_weights_into(model, unrelated, skip_regex="(unclosed")
