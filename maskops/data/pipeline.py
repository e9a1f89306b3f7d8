"""The training and evaluation data pipelines over ``dataset_convert`` shards.

Batches are ``(images, targets)``: ``images`` a list of float32 ``[3, *image_size]`` tensors
in 0..1 (resized keeping aspect ratio, then padded bottom/right: :func:`resize_and_pad`),
``targets`` a list of dicts in torchvision's format, all in that resized frame:
``boxes`` float32 ``[N, 4]`` xyxy, ``labels`` int64 ``[N]`` (contiguous 1..K), ``masks``
uint8 ``[N, *image_size]`` (absent when the shards were converted without masks or
``with_masks=False``; with ``compact_masks``, cropped to each box and with their
``mask_origins``: :mod:`maskops.mask_crops`), ``image_id`` (int, the original COCO id),
``scale`` (float, original pixels -> resized frame) and ``orig_size`` (``(h, w)`` of the
original image).

Training order (:class:`TrainStream`) is a pure function of the seed and the *global
sample position*: epoch ``e`` is a permutation of all N samples, drawn like TAO's
``tf.data`` pipeline (shard order shuffled, then a ``shuffle_buffer_size`` shuffle buffer)
but computed on indices only, so any position can be reached without reading data. The
stream of positions 0, 1, 2, ... runs through epoch after epoch without end; DDP rank
``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...``, and its batch ``b`` holds its
positions ``b * B .. b * B + B - 1``. Loader worker ``k`` of ``n`` builds batches
``b = k, k + n, ...``, which the DataLoader returns in order. Hence each sample appears
once per epoch across all ranks and workers, the batches do not depend on the number of
workers, and a run resumed with ``start_step = s`` sees exactly the batches an
uninterrupted run sees from its ``s``-th batch on. Horizontal flips (``augment_input_data``)
are drawn from the seed and the sample's global position, so they resume identically too.

Evaluation order (:class:`EvalStream`) is the conversion's file order, every image kept
(with or without annotations), truncated to ``eval_samples`` when that is set; rank ``r``
of ``W`` takes samples ``r, r + W, ...``.
"""

from __future__ import annotations

import io
import os
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchvision.io import ImageReadMode, decode_image

from maskops.data.labels import LabelMap
from maskops.data.manifest import manifests_for, resolve_shards
from maskops.data.shards import SampleLocation, ShardReader, index_shard
from maskops.data.transforms import resize_and_pad, resized_hw
from maskops.mask_crops import MASK_ORIGINS, MaskRegion, crop_regions
from maskops.spec.models import DataConfig, ExperimentSpec

Target = dict[str, Any]
Batch = tuple[list[torch.Tensor], list[Target]]


@dataclass(frozen=True)
class DecodeOptions:
    """How a shard sample becomes an ``(image, target)`` pair."""

    image_size: tuple[int, int]
    with_masks: bool = True
    skip_crowd: bool = False
    max_instances: int = 0
    """Keep at most this many instances (the first ones, in annotation order); 0 = all."""
    uint8_images: bool = False
    """Images as uint8 in 0..255 (the model divides them by 255 on its device), not float32."""
    compact_masks: bool = False
    """Masks cropped to their boxes, with their origins (:mod:`maskops.mask_crops`), not
    full frames."""


class ShardDataset(Dataset[tuple[torch.Tensor, Target]]):
    """Map-style access to the samples of the shards a pattern selects, in file order.

    ``dataset[i]`` is sample ``i`` decoded without augmentation; :meth:`load` can flip.
    Construction scans only the shards' tar headers.

    Args:
        pattern: file pattern (``OUT_DIR/train*``) or directory of shards.
        options: decoding options (image size, masks, crowd, instance cap).
        label_map: map category ids to this label map's labels instead of the shards'
            own (e.g. a checkpoint's); a category it lacks is an error naming the image.
    """

    def __init__(
        self, pattern: str | Path, options: DecodeOptions, *, label_map: LabelMap | None = None
    ) -> None:
        paths = resolve_shards(pattern)
        manifests = manifests_for(paths)
        self.label_map = label_map or manifests[0].label_map
        if label_map is None and any(m.label_map != self.label_map for m in manifests[1:]):
            raise ValueError(f"{pattern}: shards of different label maps; pass label_map")
        if options.with_masks and not all(m.include_masks for m in manifests):
            raise ValueError(
                f"{pattern}: shards were converted without masks (--no-include_mask) "
                "but masks were requested"
            )
        self.pattern = str(pattern)
        self.options = options
        self.locations: list[SampleLocation] = [
            loc for shard, path in enumerate(paths) for loc in index_shard(path, shard)
        ]
        self.shard_sizes = [0] * len(paths)
        for loc in self.locations:
            self.shard_sizes[loc.shard] += 1
        self._reader = ShardReader(paths)
        self._labels = {c.id: c.label for c in self.label_map.categories}

    def __len__(self) -> int:
        return len(self.locations)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        return self.load(index, flip=False)

    def load(self, index: int, *, flip: bool) -> tuple[torch.Tensor, Target]:
        """Read and decode sample ``index``, mirrored left-right if ``flip``."""
        sample = self._reader.read(self.locations[index])
        return decode_sample(
            sample.record, sample.image_bytes, self.options, labels=self._labels, flip=flip
        )


def decode_sample(
    record: dict[str, Any],
    image_bytes: bytes,
    options: DecodeOptions,
    *,
    labels: dict[int, int],
    flip: bool = False,
) -> tuple[torch.Tensor, Target]:
    """One shard record and its encoded image -> ``(image, target)`` (see module doc).

    Flipping happens in the original frame, before resizing and padding, so the padding
    stays bottom/right.
    """
    image = _decode_image(image_bytes, record)
    height, width = int(image.shape[1]), int(image.shape[2])
    anns = record["annotations"]
    if options.skip_crowd:
        anns = [a for a in anns if not a["iscrowd"]]
    if options.max_instances > 0:
        anns = anns[: options.max_instances]
    if flip:
        image = image.flip(-1)
    resized, scale = resize_and_pad(image, options.image_size, keep_uint8=options.uint8_images)

    boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
    if flip:
        boxes = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1)
    try:
        label_list = [labels[a["category_id"]] for a in anns]
    except KeyError as exc:
        raise ValueError(
            f"image {record['image_id']}: category id {exc.args[0]} is not in the label map"
        ) from None
    target: Target = {
        "boxes": boxes * scale,
        "labels": torch.tensor(label_list, dtype=torch.int64),
        "image_id": int(record["image_id"]),
        "scale": float(scale),
        "orig_size": (height, width),
    }
    if options.with_masks and options.compact_masks:
        regions = _mask_regions(anns, height, width, options.image_size, flip=flip)
        target["masks"], target[MASK_ORIGINS] = crop_regions(
            regions, target["boxes"], options.image_size
        )
    elif options.with_masks:
        target["masks"] = _masks(anns, height, width, options.image_size, flip=flip)
    return resized, target


def _decode_image(data: bytes, record: dict[str, Any]) -> torch.Tensor:
    """uint8 ``[3, H, W]``; PIL decodes what libjpeg/libpng in torchvision refuse."""
    try:
        with warnings.catch_warnings():
            # torchvision >= 0.29 deprecates its decoders in favour of torchcodec; they are
            # still ~1.7x faster than PIL here, and present on every supported version.
            warnings.simplefilter("ignore", DeprecationWarning)
            encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            image = decode_image(encoded, mode=ImageReadMode.RGB)
    except RuntimeError:
        try:
            with Image.open(io.BytesIO(data)) as pil:
                array = np.asarray(pil.convert("RGB"))
        except OSError as exc:
            raise ValueError(f"image {record['image_id']}: cannot decode: {exc}") from exc
        return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()
    if image.dtype == torch.uint16:
        # A 16-bit PNG decodes to 0..65535: keep each sample's high byte, as Pillow (and
        # so inference) reads it. torch has no uint16 shift; int32 holds every value.
        image = image.to(torch.int32).div(256, rounding_mode="floor").to(torch.uint8)
    return image


def _masks(
    anns: Sequence[dict[str, Any]],
    height: int,
    width: int,
    image_size: tuple[int, int],
    *,
    flip: bool,
) -> torch.Tensor:
    """Instance masks resized and padded like the image: uint8 ``[N, *image_size]``."""
    out = torch.zeros((len(anns), *image_size), dtype=torch.uint8)
    for n, (top, left, values) in enumerate(
        _mask_regions(anns, height, width, image_size, flip=flip)
    ):
        out[n, top : top + values.shape[0], left : left + values.shape[1]] = values
    return out


def _mask_regions(
    anns: Sequence[dict[str, Any]],
    height: int,
    width: int,
    image_size: tuple[int, int],
    *,
    flip: bool,
) -> Iterator[MaskRegion]:
    """Each instance's mask, resized like the image, as the region of the frame it covers.

    Resizing is nearest-neighbour with pixel centres aligned (``nearest-exact``) and only
    touches each mask's own box: the shards store masks cropped to their box.
    """
    if not anns:
        return
    new_h, new_w = resized_hw(height, width, image_size)
    rows = _nearest_sources(height, new_h)
    cols = _nearest_sources(width, new_w)
    for ann in anns:
        x, y, w, h = ann["mask_box"]
        rle = {"size": [h, w], "counts": ann["mask"].encode("ascii")}
        crop = torch.from_numpy(mask_utils.decode(rle))
        r0, r1 = np.searchsorted(rows, [y, y + h])
        if flip:  # output column j shows source column width - 1 - cols[j]
            c0, c1 = np.searchsorted(cols, [width - x - w, width - x])
            src_cols = (width - 1 - x) - cols[c0:c1]
        else:
            c0, c1 = np.searchsorted(cols, [x, x + w])
            src_cols = cols[c0:c1] - x
        src_rows = torch.from_numpy(rows[r0:r1] - y)
        values = crop.index_select(0, src_rows)[:, torch.from_numpy(src_cols)]
        yield int(r0), int(c0), values


def _nearest_sources(size: int, new_size: int) -> np.ndarray:
    """For each output index, the source index ``nearest-exact`` resizing samples (int64,
    non-decreasing): ``floor((i + 0.5) * size / new_size)``, clamped to ``size - 1``."""
    centres = (np.arange(new_size, dtype=np.float64) + 0.5) * (size / new_size)
    return np.minimum(np.floor(centres).astype(np.int64), size - 1)


def epoch_order(
    shard_sizes: Sequence[int], *, seed: int, epoch: int, buffer_size: int
) -> list[int]:
    """The sample indices of one training epoch, in order (a permutation of all samples).

    Shards are visited in a shuffled order and their samples streamed through a shuffle
    buffer of ``buffer_size`` (TF semantics: each output is a uniform pick from the buffer,
    replaced by the next input; ``buffer_size <= 1`` keeps the stream order).
    """
    rng = random.Random(f"maskops-epoch-{seed}-{epoch}")
    starts = np.cumsum([0, *shard_sizes])
    shards = list(range(len(shard_sizes)))
    rng.shuffle(shards)
    stream = (i for s in shards for i in range(int(starts[s]), int(starts[s + 1])))
    if buffer_size <= 1:
        return list(stream)
    order: list[int] = []
    buffer: list[int] = []
    for index in stream:
        if len(buffer) < buffer_size:
            buffer.append(index)
            continue
        pick = rng.randrange(buffer_size)
        order.append(buffer[pick])
        buffer[pick] = index
    rng.shuffle(buffer)
    order.extend(buffer)
    return order


def _flip_of(seed: int, position: int) -> bool:
    return random.Random(f"maskops-flip-{seed}-{position}").random() < 0.5


def collate(samples: Sequence[tuple[torch.Tensor, Target]]) -> Batch:
    return [s[0] for s in samples], [s[1] for s in samples]


def _identity(batch: Any) -> Any:
    return batch


def _worker_slot() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class TrainStream(IterableDataset[Batch]):
    """The endless, resumable, DDP- and worker-sharded training batch stream (module doc).

    Args:
        dataset: the decoded samples.
        batch_size: samples per batch on this rank.
        seed: order and flip seed.
        rank, world_size: this process's DDP slot.
        start_step: batches this rank has already consumed (optimizer steps times
            ``accumulate_grad_steps`` when accumulating); the stream starts after them.
        shuffle_buffer_size: see :func:`epoch_order`.
        augment: draw a horizontal flip with probability 0.5 per sample.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        shuffle_buffer_size: int = 4096,
        augment: bool = True,
    ) -> None:
        if len(dataset) == 0:
            raise ValueError(f"{dataset.pattern}: the shards hold no samples")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if batch_size < 1 or start_step < 0:
            raise ValueError(f"batch_size {batch_size} / start_step {start_step} out of range")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_step = start_step
        self.shuffle_buffer_size = shuffle_buffer_size
        self.augment = augment
        self._orders: dict[int, list[int]] = {}

    def global_positions(self, batch: int) -> list[int]:
        """Global stream positions that make up this rank's batch ``batch``."""
        first = batch * self.batch_size
        return [(first + i) * self.world_size + self.rank for i in range(self.batch_size)]

    def sample_index(self, position: int) -> int:
        """The dataset index at a global stream position."""
        epoch, offset = divmod(position, len(self.dataset))
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            order = self._orders[epoch] = epoch_order(
                self.dataset.shard_sizes,
                seed=self.seed,
                epoch=epoch,
                buffer_size=self.shuffle_buffer_size,
            )
        return order[offset]

    def batch(self, batch: int) -> Batch:
        samples = [
            self.dataset.load(self.sample_index(p), flip=self.augment and _flip_of(self.seed, p))
            for p in self.global_positions(batch)
        ]
        return collate(samples)

    def __iter__(self) -> Iterator[Batch]:
        worker, workers = _worker_slot()
        batch = self.start_step + worker
        while True:
            yield self.batch(batch)
            batch += workers


class EvalStream(IterableDataset[Batch]):
    """The finite evaluation batch stream: file order, this rank's share, every image."""

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        max_samples: int = 0,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        total = len(dataset) if max_samples <= 0 else min(max_samples, len(dataset))
        self.indices = list(range(rank, total, world_size))

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        worker, workers = _worker_slot()
        for batch in range(worker, len(self), workers):
            chunk = self.indices[batch * self.batch_size : (batch + 1) * self.batch_size]
            yield collate([self.dataset.load(i, flip=False) for i in chunk])


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def loader_workers(requested: int | None, *, local_ranks: int | None = None) -> int:
    """Loader worker processes of one training process.

    ``requested``: the spec's ``n_workers`` where the spec sets it (TAO's meaning: the
    workers of each training process, 16 by default), capped by the usable cores. Where
    the spec leaves it unset (None; TAO's sample specs do), this process's share of the
    usable cores among the ``local_ranks`` training processes on this host (None:
    torchrun's ``LOCAL_WORLD_SIZE``, 1 without torchrun), less one core for the process
    itself, which launches the device's work and pins the batches: 15 workers for one GPU
    on 16 cores, 1 each for eight GPUs on 16 cores (not 16 each).
    """
    cores = usable_cores()
    if requested is not None:
        return max(0, min(requested, cores))
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, cores // max(1, local_ranks) - 1)


def spec_workers(data: DataConfig) -> int | None:
    """The spec's ``n_workers`` if the spec sets it, else None (:func:`loader_workers`)."""
    return data.n_workers if "n_workers" in data.model_fields_set else None


def _loader(
    stream: IterableDataset[Batch],
    workers: int,
    prefetch: int,
    seed: int,
    *,
    pin_memory: bool = False,
) -> DataLoader[Batch]:
    return DataLoader(
        stream,
        batch_size=None,
        num_workers=workers,
        collate_fn=_identity,
        prefetch_factor=(prefetch or None) if workers > 0 else None,
        persistent_workers=False,
        # Page-locked batches: their non_blocking copies to a GPU do not block the host.
        pin_memory=pin_memory,
        # Each iterator draws a base seed; from its own generator it leaves the global torch
        # RNG (the training run's, restored on resume) untouched. The streams themselves
        # draw nothing from torch.
        generator=torch.Generator().manual_seed(seed),
    )


def build_train_loader(
    spec: ExperimentSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    start_step: int = 0,
    batch_size: int | None = None,
    label_map: LabelMap | None = None,
    pin_memory: bool = False,
    uint8_images: bool = False,
    compact_masks: bool = False,
) -> DataLoader[Batch]:
    """The endless training loader for ``spec.data_config.training_file_pattern``.

    Honours image_size, augment_input_data (h-flip), skip_crowd_during_training,
    max_num_instances, shuffle_buffer_size, n_workers (:func:`loader_workers`),
    prefetch_buffer_size (batches per worker; 0 = torch's default), seed,
    train_batch_size (unless ``batch_size`` is given) and maskrcnn_config.include_mask.
    Take as many batches as needed: the loader never ends (epochs follow each other).

    Args:
        start_step: batches this rank already consumed; a resumed run passes what it had
            consumed at its checkpoint and continues the identical stream (module doc).
        label_map: labels to use instead of the shards' own (must cover their categories).
        pin_memory: return batches in page-locked memory (for a CUDA device; tuples in
            the targets, such as ``orig_size``, come back as lists).
        uint8_images: images as uint8 in 0..255 (:class:`DecodeOptions`).
        compact_masks: masks cropped to their boxes (:class:`DecodeOptions`).
    """
    data = spec.data_config
    dataset = ShardDataset(
        data.training_file_pattern,
        DecodeOptions(
            image_size=data.image_size,
            with_masks=spec.maskrcnn_config.include_mask,
            skip_crowd=data.skip_crowd_during_training,
            max_instances=data.max_num_instances,
            uint8_images=uint8_images,
            compact_masks=compact_masks,
        ),
        label_map=label_map,
    )
    stream = TrainStream(
        dataset,
        batch_size=batch_size or spec.train_batch_size,
        seed=spec.seed,
        rank=rank,
        world_size=world_size,
        start_step=start_step,
        shuffle_buffer_size=data.shuffle_buffer_size,
        augment=data.augment_input_data,
    )
    workers = loader_workers(spec_workers(data))
    return _loader(stream, workers, data.prefetch_buffer_size, spec.seed, pin_memory=pin_memory)


def build_eval_loader(
    spec: ExperimentSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    batch_size: int | None = None,
    label_map: LabelMap | None = None,
    with_masks: bool | None = None,
) -> DataLoader[Batch]:
    """The evaluation loader for ``spec.data_config.validation_file_pattern``.

    File order, no augmentation, crowd kept, no instance cap, every image (also those
    without annotations), the first ``eval_samples`` only when that is > 0, batches of
    ``eval_batch_size`` (unless ``batch_size`` is given). ``len(loader)`` is the number of
    batches. ``with_masks`` defaults to ``include_mask``; pass False when only the
    images and ids are needed (COCO evaluation against val_json_file) to skip mask decoding.
    """
    data = spec.data_config
    dataset = ShardDataset(
        data.validation_file_pattern,
        DecodeOptions(
            image_size=data.image_size,
            with_masks=spec.maskrcnn_config.include_mask if with_masks is None else with_masks,
        ),
        label_map=label_map,
    )
    stream = EvalStream(
        dataset,
        batch_size=batch_size or spec.eval_batch_size,
        rank=rank,
        world_size=world_size,
        max_samples=data.eval_samples,
    )
    workers = loader_workers(spec_workers(data))
    return _loader(stream, workers, data.prefetch_buffer_size, spec.seed)
