"""resize_and_pad: the one resize every path (training, evaluation, serving) shares."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from maskops.data.transforms import resize_and_pad, resized_hw


@pytest.mark.parametrize(
    ("shape", "size"), [((100, 130), (128, 192)), ((480, 640), (128, 128)), ((64, 64), (64, 64))]
)
def test_uint8_and_float_inputs_agree_and_pad_bottom_right(
    shape: tuple[int, int], size: tuple[int, int]
) -> None:
    image = torch.randint(0, 256, (3, *shape), dtype=torch.uint8, generator=torch.Generator())
    from_uint8, scale = resize_and_pad(image, size)
    from_float, scale_float = resize_and_pad(image.float() / 255, size)
    assert scale == scale_float == min(size[0] / shape[0], size[1] / shape[1])
    assert from_uint8.dtype == torch.float32 and from_uint8.shape == (3, *size)
    assert (from_uint8 - from_float).abs().max() <= 1.0 / 255 + 1e-6
    new_h, new_w = resized_hw(*shape, size)
    assert from_uint8[:, new_h:, :].abs().sum() == 0 and from_uint8[:, :, new_w:].abs().sum() == 0
    expected = F.interpolate(
        image[None].float() / 255, size=(new_h, new_w), mode="bilinear", antialias=True
    )[0]
    assert torch.allclose(from_float[:, :new_h, :new_w], expected, atol=1e-6)


def test_rejects_non_rgb() -> None:
    with pytest.raises(ValueError, match=r"expected a \[3, H, W\] image, got shape \(1, 8, 8\)"):
        resize_and_pad(torch.zeros((1, 8, 8)), (16, 16))
