"""Forward passes of the built model: training losses, eval outputs, variants."""

from __future__ import annotations

import math
from collections.abc import Callable
from copy import deepcopy

import pytest
import torch

from maskops.modeling import LOSS_NAMES, SpecMaskRCNN, build_model
from maskops.modeling.heads import Float32FastRCNNPredictor, Float32RPNHead
from maskops.spec.models import MaskRCNNConfig

NUM_CLASSES = 4


def _train_step(model: SpecMaskRCNN, images: list[torch.Tensor], targets: list[dict]) -> dict:
    model.train()
    losses = model(images, targets)
    assert isinstance(losses, dict)
    torch.stack(list(losses.values())).sum().backward()
    return losses


def _check_detections(
    out: dict[str, torch.Tensor], size: tuple[int, int], resolution: int, max_dets: int
) -> None:
    n = out["boxes"].shape[0]
    assert 0 < n <= max_dets
    assert out["boxes"].dtype == torch.float32 and out["boxes"].shape == (n, 4)
    assert out["scores"].shape == (n,) and out["labels"].dtype == torch.int64
    assert int(out["labels"].min()) >= 1 and int(out["labels"].max()) < NUM_CLASSES
    # Boxes stay in the input frame (the model never resizes): clipped to the image.
    assert float(out["boxes"][:, [0, 2]].max()) <= size[1]
    assert float(out["boxes"][:, [1, 3]].max()) <= size[0]
    assert float(out["boxes"].min()) >= 0
    masks = out["masks"]
    assert masks.shape == (n, 1, resolution, resolution) and masks.dtype == torch.float32
    assert float(masks.min()) >= 0 and float(masks.max()) <= 1


@pytest.mark.parametrize("sizes", [[(128, 192), (128, 192)], [(100, 150), (128, 96)]])
def test_train_and_eval_forward_at_several_image_sizes(
    sizes: list[tuple[int, int]], tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 192))
    images = [torch.rand(3, h, w) for h, w in sizes]
    targets = [make_targets(size, [[10, 12, 60, 70], [50, 40, 90, 96]], [1, 3]) for size in sizes]
    losses = _train_step(model, images, targets)
    assert set(losses) == set(LOSS_NAMES)
    assert all(torch.isfinite(v) and v.ndim == 0 for v in losses.values())
    # Fresh predictors start uninformed (see maskops.modeling.heads): the class loss is
    # ln(num_classes) and the mask loss ln(2), not torchvision's ~8 for few classes.
    assert losses["loss_classifier"].item() == pytest.approx(math.log(NUM_CLASSES), abs=0.05)
    assert losses["loss_mask"].item() == pytest.approx(math.log(2), abs=0.02)
    assert model.roi_heads.mask_predictor.mask_fcn_logits.weight.grad is not None
    assert model.backbone.body.conv1.weight.grad is not None

    model.eval()
    with torch.no_grad():
        outputs = model(images)
    assert len(outputs) == len(images)
    for out, size in zip(outputs, sizes, strict=True):
        _check_detections(out, size, resolution=28, max_dets=20)


def test_image_without_objects_trains(
    tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128))
    targets = [make_targets((128, 128), [], []), make_targets((128, 128), [[8, 8, 64, 64]], [2])]
    losses = _train_step(model, [torch.rand(3, 128, 128) for _ in range(2)], targets)
    assert all(torch.isfinite(v) for v in losses.values())


def test_include_mask_false_is_faster_rcnn(
    tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    model = build_model(
        tiny_config(include_mask=False), num_classes=NUM_CLASSES, image_size=(128, 128)
    )
    assert not model.roi_heads.has_mask()
    assert not any(k.startswith("roi_heads.mask") for k in model.state_dict())
    target = make_targets((128, 128), [[10, 10, 70, 90]], [1])
    del target["masks"]  # not needed without a mask branch
    losses = _train_step(model, [torch.rand(3, 128, 128)], [target])
    assert set(losses) == set(LOSS_NAMES) - {"loss_mask"}
    model.eval()
    with torch.no_grad():
        (out,) = model([torch.rand(3, 128, 128)])
    assert set(out) == {"boxes", "labels", "scores"}


def test_mrcnn_resolution_and_detections_per_image_shape_the_output(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    model = build_model(
        tiny_config(mrcnn_resolution=16, test_detections_per_image=7),
        num_classes=NUM_CLASSES,
        image_size=(128, 128),
    ).eval()
    with torch.no_grad():
        (out,) = model([torch.rand(3, 128, 128)])
    _check_detections(out, (128, 128), resolution=16, max_dets=7)
    assert out["boxes"].shape[0] == 7  # random weights score every class above 0.05


def test_loss_weights_scale_exactly_their_losses(
    tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    weights = {
        "rpn_box_loss_weight": 2.0,
        "fast_rcnn_box_loss_weight": 3.0,
        "mrcnn_weight_loss_mask": 0.5,
    }
    base = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128))
    weighted = build_model(tiny_config(**weights), num_classes=NUM_CLASSES, image_size=(128, 128))
    weighted.load_state_dict(base.state_dict())
    images = [torch.rand(3, 128, 128)]
    targets = [make_targets((128, 128), [[10, 12, 60, 70], [50, 40, 120, 96]], [1, 3])]
    results = []
    for model in (base, weighted):
        torch.manual_seed(1)  # the same anchor/proposal sampling in both runs
        results.append(_train_step(model, images, targets))
    plain, scaled = results
    factors = {"loss_rpn_box_reg": 2.0, "loss_box_reg": 3.0, "loss_mask": 0.5}
    for key in LOSS_NAMES:
        expected = plain[key] * factors.get(key, 1.0)
        torch.testing.assert_close(scaled[key], expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_channels_last_gives_the_same_detections(
    device: str, monkeypatch: pytest.MonkeyPatch, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    """Training keeps the model channels_last on a CPU and on Ampere and later GPUs
    (``trains_channels_last``): in fp32 (TF32 off, so that both layouts compute exactly) it
    detects what the NCHW model detects."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128))
    model = model.to(device).eval()
    images = [torch.rand(3, 128, 128, device=device)]
    with torch.no_grad():
        (ref,) = model(images)
        (out,) = model.to_channels_last()(images)
    assert model.backbone.body.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out["scores"], ref["scores"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["boxes"], ref["boxes"], atol=1e-3, rtol=1e-4)


def test_compiling_the_backbone_keeps_its_module_and_parameter_names(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    """``compiled_backbone`` compiles in place: checkpoints and the optimizer see the same
    names and tensors. (Compiling itself takes minutes on a CPU: a GPU run's
    ``throughput_tuning`` trains the ``compile`` arm.)"""
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128))
    names, parameters = list(model.state_dict()), list(model.parameters())
    backbone = model.backbone
    assert model.compile_backbone("max-autotune") is model
    assert model.backbone is backbone and backbone._compiled_call_impl is not None
    assert model.rpn._compiled_call_impl is None  # the backbone and FPN only
    assert list(model.state_dict()) == names
    assert all(a is b for a, b in zip(model.parameters(), parameters, strict=True))


def test_heads_return_float32_under_autocast() -> None:
    rpn_head = Float32RPNHead(16, 3)
    predictor = Float32FastRCNNPredictor(32, NUM_CLASSES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, deltas = rpn_head([torch.rand(1, 16, 8, 8)])
        scores, boxes = predictor(torch.rand(5, 32))
    assert {t.dtype for t in [*logits, *deltas, scores, boxes]} == {torch.float32}


def test_bad_inputs_are_rejected_clearly(tiny_config: Callable[..., MaskRCNNConfig]) -> None:
    with pytest.raises(ValueError, match="multiple of 2\\*\\*max_level = 64"):
        build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(100, 128))
    with pytest.raises(ValueError, match="num_classes"):
        build_model(tiny_config(), num_classes=1, image_size=(128, 128))
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128)).eval()
    with pytest.raises(TypeError, match=r"image 0: expected a float tensor in 0\.\.1 or uint8"):
        model([torch.zeros(3, 128, 128, dtype=torch.int16)])
    with pytest.raises(ValueError, match="image 0: expected a \\[3, H, W\\] tensor"):
        model([torch.rand(1, 3, 128, 128)])
    model.train()
    images = [torch.rand(3, 128, 128), torch.rand(3, 128, 128)]
    good = {"boxes": torch.tensor([[10.0, 10, 40, 40]]), "labels": torch.tensor([1])}
    flat = {
        "boxes": torch.tensor([[10.0, 10, 40, 40], [50, 20, 50, 30]]),
        "labels": torch.tensor([1, 2]),
    }
    with pytest.raises(
        ValueError,
        match=r"target 1: every box must have a positive width .* \[50\.0, 20\.0, 50\.0, 30\.0\]",
    ):
        model(images, [good, flat])
    with pytest.raises(ValueError, match=r"target 0: boxes must be a \[N, 4\] tensor, got \(4,\)"):
        model(
            images, [{"boxes": torch.tensor([10.0, 10, 40, 40]), "labels": torch.tensor([1])}, good]
        )


def test_rpn_filtering_uses_the_mode_thresholds_min_size_and_per_level_top_n(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    model = build_model(
        tiny_config(
            train_rpn_nms_threshold=0.7,
            test_rpn_nms_thresh=0.5,
            rpn_min_size=4.0,
            train_rpn_pre_nms_topn=2,
            test_rpn_pre_nms_topn=2,
        ),
        num_classes=NUM_CLASSES,
        image_size=(128, 128),
    )
    # Level 0: two boxes with IoU 0.6, one 3-px box, one low-scoring box that only a
    # pre-NMS top-n above 2 would keep. Level 1: one box.
    level0 = [[0, 0, 40, 40], [0, 10, 40, 50], [60, 60, 63, 63], [90, 90, 120, 120]]
    level1 = [[70, 0, 110, 40]]
    proposals = torch.tensor([level0 + level1], dtype=torch.float32)
    objectness = torch.tensor([[3.0, 2.0, 4.0, -5.0, 1.0]])

    def kept(training: bool) -> list[list[float]]:
        model.rpn.train(training)
        boxes, _ = model.rpn.filter_proposals(proposals, objectness, [(128, 128)], [4, 1])
        return sorted(boxes[0].tolist())

    # Top-2 per level keeps the 3-px box and the first box on level 0 (not the IoU-0.6
    # partner or the low scorer); the 3-px box then falls under rpn_min_size.
    assert kept(training=True) == [[0, 0, 40, 40], [70, 0, 110, 40]]
    model.rpn._pre_nms_top_n = {"training": 4, "testing": 4}
    # Training NMS at 0.7 keeps both overlapping boxes; testing NMS at 0.5 drops one.
    assert [0, 10, 40, 50] in kept(training=True)
    assert [0, 10, 40, 50] not in kept(training=False)
    assert [90, 90, 120, 120] in kept(training=False)


def test_validation_losses_change_nothing(
    tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    targets = [make_targets((128, 128), [[10, 12, 60, 70]], [2])]
    losses = model.validation_losses([torch.rand(3, 128, 128)], targets)
    assert set(losses) == set(LOSS_NAMES)
    assert all(torch.isfinite(v) and not v.requires_grad for v in losses.values())
    assert not model.training and not any(m.training for m in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN statistics included


@pytest.mark.parametrize("sizes", [[(128, 128), (128, 128)], [(128, 128), (64, 128)]])
def test_uint8_images_train_and_detect_as_the_float_images_they_divide_to(
    sizes: list[tuple[int, int]], tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    """uint8 images are divided by 255 on the model's device, as the data pipeline divides
    them: the losses, gradients and detections are the float path's, bit for bit."""
    torch.manual_seed(0)
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128))
    raw = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in sizes]
    floats = [img.to(torch.float32).div_(255.0) for img in raw]
    targets = [make_targets(size, [[8, 8, 64, 64]], [2]) for size in sizes]
    runs = []
    for images in (floats, raw):
        copy = deepcopy(model)  # training mode updates batch-norm statistics
        torch.manual_seed(1)
        losses = _train_step(copy, images, targets)
        grad = copy.backbone.body.conv1.weight.grad
        assert grad is not None
        with torch.no_grad():
            (detections, *_) = model.eval()(images)
        runs.append((losses, grad, detections))
    (losses_f, grad_f, det_f), (losses_u, grad_u, det_u) = runs
    assert {k: v.item() for k, v in losses_f.items()} == {k: v.item() for k, v in losses_u.items()}
    assert torch.equal(grad_f, grad_u)
    assert all(torch.equal(det_f[k], det_u[k]) for k in det_f)


def test_normalisation_constants_are_made_once_per_dtype_and_device(
    tiny_config: Callable[..., MaskRCNNConfig],
) -> None:
    model = build_model(tiny_config(), num_classes=NUM_CLASSES, image_size=(128, 128)).eval()
    transform = model.transform
    images = [torch.rand(3, 128, 128)]
    first, _ = transform(images)
    constants = transform._mean_std(torch.float32, torch.device("cpu"))
    second, _ = transform(images)
    assert transform._mean_std(torch.float32, torch.device("cpu")) is constants
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    assert torch.equal(first.tensors, second.tensors)
    assert torch.equal(first.tensors[0], (images[0] - mean) / std)
