"""The model's input/output transform: normalise and batch, never resize, never paste.

Inputs arrive already resized and padded to the spec's image_size
(:func:`maskops.data.transforms.resize_and_pad`), so resizing inside the model would only
cost time, and in an exported graph it would bake the example's size in. Pasting 28x28
mask probabilities into full images is left to post-processing
(:mod:`maskops.evaluation.postprocess`), which pastes only within each box.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.transform import GeneralizedRCNNTransform

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def unit_range(images: Tensor) -> Tensor:
    """uint8 images (0..255) as float32 in 0..1, exactly as the data pipeline divides them
    (:func:`maskops.data.transforms.resize_and_pad`) on any device; float images unchanged.
    """
    if images.dtype == torch.uint8:
        # A divisor on the images' device, not a Python number: CUDA divides by a host
        # scalar as a product with its reciprocal, which misses the quotient by one unit in
        # the last place for 126 of the 256 values.
        divisor = torch.full((), 255.0, dtype=torch.float32, device=images.device)
        return images.to(torch.float32).div_(divisor)
    return images


class NoResizeTransform(GeneralizedRCNNTransform):
    """Normalises (ImageNet mean/std) and batches images; boxes and masks stay as given.

    Batching pads bottom/right with zeros (after normalisation, as torchvision does) to the
    largest image and then to a multiple of ``size_divisible`` (``2**max_level``, so every
    FPN level has an integral stride). ``image_sizes`` in the returned ``ImageList`` are the
    unpadded input sizes; predictions are clipped to them.
    """

    def __init__(self, *, size_divisible: int, image_size: tuple[int, int]) -> None:
        super().__init__(
            min_size=min(image_size),
            max_size=max(image_size),
            image_mean=list(IMAGENET_MEAN),
            image_std=list(IMAGENET_STD),
            size_divisible=size_divisible,
        )
        self.image_size = image_size
        self.memory_format = torch.contiguous_format
        """Memory format of the batched tensor; channels_last for a channels_last model."""
        self._constants: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}

    def forward(
        self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None
    ) -> tuple[ImageList, list[dict[str, Tensor]] | None]:
        """Args:
            images: float ``[3, H, W]`` tensors in 0..1, or uint8 in 0..255 (a quarter of
                the bytes to copy to the device, divided by 255 there); sizes may differ.
            targets: passed through unchanged (a shallow copy of each dict).

        Returns:
            ``ImageList`` of a ``[B, 3, H', W']`` normalised tensor (``H'``, ``W'`` multiples
            of ``size_divisible``) with the per-image ``(H, W)``; the targets.
        """
        for i, image in enumerate(images):
            if image.dim() != 3 or image.shape[0] != 3:
                raise ValueError(
                    f"image {i}: expected a [3, H, W] tensor, got {tuple(image.shape)}"
                )
            if not image.is_floating_point() and image.dtype != torch.uint8:
                raise TypeError(
                    f"image {i}: expected a float tensor in 0..1 or uint8 in 0..255, "
                    f"got {image.dtype}"
                )
        image_sizes = [(int(img.shape[-2]), int(img.shape[-1])) for img in images]
        if len(set(image_sizes)) == 1:
            # The common case (everything resized+padded to image_size): one stacked
            # normalisation instead of one per image, and a pad that traces shape-safely.
            batch = self.normalize_batch(unit_range(torch.stack(images)))
            batch = self._pad_to_divisible(batch)
        else:
            batch = self.batch_images(
                [self.normalize(unit_range(img)) for img in images],
                size_divisible=self.size_divisible,
            )
        batch = batch.contiguous(memory_format=self.memory_format)
        copied = None if targets is None else [dict(t) for t in targets]
        return ImageList(batch, image_sizes), copied

    def normalize_batch(self, batch: Tensor) -> Tensor:
        """``[B, 3, H, W]`` in 0..1 -> ImageNet-normalised, same shape and dtype."""
        mean, std = self._mean_std(batch.dtype, batch.device)
        return (batch - mean) / std

    def _mean_std(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """``[3, 1, 1]`` mean and std in ``dtype`` on ``device``, made once per pair.

        Made from the Python lists at every call, they were copied to a GPU at every step,
        and a copy from pageable memory makes the host wait for the device. While tracing
        or compiling they are made afresh: a graph holds them as its own constants.
        """
        key = (dtype, device)
        cached = self._constants.get(key)
        traced = torch.jit.is_tracing() or torch.compiler.is_compiling()
        if cached is None or traced:
            mean = torch.as_tensor(self.image_mean, dtype=dtype, device=device)[:, None, None]
            std = torch.as_tensor(self.image_std, dtype=dtype, device=device)[:, None, None]
            cached = (mean, std)
            if not traced:
                self._constants[key] = cached
        return cached

    def _pad_to_divisible(self, batch: Tensor) -> Tensor:
        height, width = batch.shape[-2], batch.shape[-1]
        d = self.size_divisible
        pad_h = (d - height % d) % d
        pad_w = (d - width % d) % d
        if pad_h == 0 and pad_w == 0:
            return batch
        return F.pad(batch, (0, pad_w, 0, pad_h))

    def resize(
        self, image: Tensor, target: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        return image, target

    def postprocess(
        self,
        result: list[dict[str, Tensor]],
        image_shapes: list[tuple[int, int]],
        original_image_sizes: list[tuple[int, int]],
    ) -> list[dict[str, Tensor]]:
        """Identity: boxes stay in the input frame, masks stay ``[N, 1, M, M]`` probabilities."""
        return result

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(Normalize(mean={self.image_mean}, std={self.image_std}), "
            f"pad to a multiple of {self.size_divisible}, no resize)"
        )
