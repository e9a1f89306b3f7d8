"""The model on a CUDA GPU: AMP training step, and a checkpoint loaded onto the device."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from maskops.checkpoints.model_file import load_model, save_checkpoint
from maskops.data.labels import LabelMap
from maskops.modeling import LOSS_NAMES, build_model
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amp_training_step_and_eval_on_cuda(
    dtype: torch.dtype, tiny_config: Callable[..., MaskRCNNConfig], make_targets: Callable
) -> None:
    device = torch.device("cuda")
    model = build_model(tiny_config(nlayers=18), num_classes=3, image_size=(256, 256)).to(device)
    images = [torch.rand(3, 256, 256, device=device) for _ in range(2)]
    targets = [
        {k: v.to(device) for k, v in make_targets((256, 256), [[20, 30, 120, 200]], [1]).items()}
        for _ in images
    ]
    with torch.autocast("cuda", dtype=dtype):
        losses = model(images, targets)
    assert isinstance(losses, dict) and set(losses) == set(LOSS_NAMES)
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    torch.stack(list(losses.values())).sum().backward()
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        (out,) = model(images[:1])
    assert out["boxes"].dtype == torch.float32 and out["masks"].dtype == torch.float32
    assert out["boxes"].device.type == "cuda"


def test_checkpoint_loads_onto_cuda(
    tmp_path: Path, tiny_config: Callable[..., MaskRCNNConfig]
) -> None:
    config = tiny_config()
    model = build_model(config, num_classes=3, image_size=(128, 128)).eval()
    labels = LabelMap.from_coco_categories([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    spec = ExperimentSpec(data_config=DataConfig(image_size=(128, 128)), maskrcnn_config=config)
    path = save_checkpoint(tmp_path / "m.pth", model=model, spec=spec, label_map=labels, step=1)
    loaded = load_model(path, map_location="cuda")
    assert all(p.device.type == "cuda" for p in loaded.model.parameters())
    image = torch.rand(3, 128, 128)
    with torch.no_grad():
        (ref,) = model([image])
        (got,) = loaded.model([image.cuda()])
    torch.testing.assert_close(got["scores"].cpu(), ref["scores"], atol=1e-3, rtol=1e-3)


def test_uint8_images_divide_on_the_gpu_exactly_as_on_the_host() -> None:
    """Every uint8 value divided by 255 on the GPU (``unit_range``: the uint8 training
    images and the torch network's served input) is the host's float32 quotient, to the
    bit: a product with the reciprocal would miss it for 126 of the 256."""
    from maskops.modeling.transform import unit_range

    values = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16)
    on_gpu = unit_range(values.cuda()).cpu()
    assert torch.equal(on_gpu, values.to(torch.float32) / torch.tensor(255.0))
    assert torch.equal(on_gpu, unit_range(values))
