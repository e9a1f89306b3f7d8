"""The shard pipeline: targets, augmentation, sharding across ranks/workers, resume."""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskops.data.convert import convert_dataset
from maskops.data.labels import LabelMap
from maskops.data.pipeline import (
    DecodeOptions,
    EvalStream,
    ShardDataset,
    TrainStream,
    _masks,
    build_eval_loader,
    build_train_loader,
    epoch_order,
    loader_workers,
    spec_workers,
    usable_cores,
)
from maskops.data.transforms import resized_hw
from maskops.data.validate import _cropped_mask
from maskops.modeling.transform import unit_range
from maskops.spec import parse_spec_text
from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig

SIZE = (128, 192)


def _spec(shards: Path, **data: Any) -> ExperimentSpec:
    fields: dict[str, Any] = {
        "image_size": SIZE,
        "training_file_pattern": f"{shards}/train*",
        "validation_file_pattern": f"{shards}/val*",
        "num_classes": 4,
        "n_workers": 0,
        "shuffle_buffer_size": 8,
        **data,
    }
    return ExperimentSpec(
        seed=5, train_batch_size=2, eval_batch_size=3, data_config=DataConfig(**fields)
    )


def _ids(batches) -> list[list[int]]:
    return [[t["image_id"] for t in targets] for _, targets in batches]


def test_train_batches_have_the_contract_format(demo_shards: Path) -> None:
    images, targets = next(iter(build_train_loader(_spec(demo_shards))))
    assert len(images) == len(targets) == 2
    for image, target in zip(images, targets, strict=True):
        assert image.dtype == torch.float32 and image.shape == (3, *SIZE)
        assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0
        n = len(target["labels"])
        assert target["boxes"].dtype == torch.float32 and target["boxes"].shape == (n, 4)
        assert target["labels"].dtype == torch.int64 and set(target["labels"].tolist()) <= {1, 2, 3}
        assert target["masks"].dtype == torch.uint8 and target["masks"].shape == (n, *SIZE)
        assert target["orig_size"] == (128, 128) and target["scale"] == 1.0
        assert image[:, :, 128:].abs().sum() == 0  # padded on the right
        for box, mask in zip(target["boxes"], target["masks"], strict=True):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            mask_box = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float()
            assert torch.allclose(box, mask_box, atol=1.0)


def test_resize_scales_boxes_and_masks_consistently(demo_dataset, demo_shards: Path) -> None:
    """At half size, boxes and masks shrink together and match the COCO ground truth."""
    options = DecodeOptions(image_size=(64, 64))
    dataset = ShardDataset(f"{demo_shards}/val*", options)
    coco = COCO(str(demo_dataset.val_json))
    for index in range(len(dataset)):
        image, target = dataset[index]
        assert image.shape == (3, 64, 64) and target["scale"] == 0.5
        anns = coco.loadAnns(coco.getAnnIds(imgIds=target["image_id"]))
        expected = torch.tensor([a["bbox"] for a in anns]).reshape(-1, 4)
        expected[:, 2:] += expected[:, :2]
        assert torch.allclose(target["boxes"], expected * 0.5)
        areas = torch.tensor([float(a["area"]) for a in anns])
        assert torch.allclose(target["masks"].sum((1, 2)).float(), areas / 4, rtol=0.25, atol=4)


def test_flip_mirrors_image_boxes_and_masks(demo_shards: Path) -> None:
    dataset = ShardDataset(f"{demo_shards}/train*", DecodeOptions(image_size=SIZE))
    plain_image, plain = dataset.load(0, flip=False)
    flip_image, flipped = dataset.load(0, flip=True)
    assert torch.equal(flip_image[:, :, :128], plain_image[:, :, :128].flip(-1))
    assert torch.equal(flipped["masks"][:, :, :128], plain["masks"][:, :, :128].flip(-1))
    x0, y0, x1, y1 = plain["boxes"].unbind(1)
    assert torch.allclose(flipped["boxes"], torch.stack([128 - x1, y0, 128 - x0, y1], 1))


def test_crowd_and_instance_cap(broken_dataset, tmp_path: Path) -> None:
    convert_dataset(broken_dataset.image_dir, broken_dataset.annotation_file, tmp_path, tag="train")

    def labels_of(**options: Any) -> int:
        dataset = ShardDataset(f"{tmp_path}/train*", DecodeOptions(image_size=SIZE, **options))
        return next(
            len(t["labels"])
            for _, t in (dataset[i] for i in range(len(dataset)))
            if t["image_id"] == 1
        )

    assert labels_of() == 8
    assert labels_of(skip_crowd=True) == 7
    assert labels_of(skip_crowd=True, max_instances=3) == 3


def test_two_ranks_two_workers_see_every_sample_exactly_once(demo_shards: Path) -> None:
    spec = _spec(demo_shards, n_workers=2)
    seen: Counter[int] = Counter()
    for rank in range(2):
        loader = build_train_loader(spec, rank=rank, world_size=2, batch_size=1)
        assert loader.num_workers == 2
        seen.update(i for batch in _ids(islice(loader, 12)) for i in batch)  # 24 / 2 ranks
    assert seen == Counter(range(1, 25))

    evaluated: Counter[int] = Counter()
    for rank in range(2):
        loader = build_eval_loader(spec, rank=rank, world_size=2, batch_size=1)
        evaluated.update(i for batch in _ids(loader) for i in batch)
    assert evaluated == Counter(range(25, 33))


def test_order_is_seeded_and_independent_of_worker_count(demo_shards: Path) -> None:
    def first(spec: ExperimentSpec, **kwargs: Any) -> list[list[int]]:
        return _ids(islice(build_train_loader(spec, **kwargs), 15))

    reference = first(_spec(demo_shards))
    assert reference == first(_spec(demo_shards, n_workers=2, prefetch_buffer_size=1))
    other = first(_spec(demo_shards).model_copy(update={"seed": 6}))
    assert reference != other
    flat = [i for batch in reference[:12] for i in batch]
    assert sorted(flat) == list(range(1, 25)), "one epoch is a permutation"
    assert flat != sorted(flat)


def test_resume_continues_the_identical_stream(demo_shards: Path) -> None:
    spec = _spec(demo_shards)
    full = list(islice(build_train_loader(spec), 16))
    resumed = list(islice(build_train_loader(spec, start_step=11), 5))
    for (images_a, targets_a), (images_b, targets_b) in zip(full[11:], resumed, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(images_a, images_b, strict=True))
        for a, b in zip(targets_a, targets_b, strict=True):
            assert a["image_id"] == b["image_id"]
            assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["masks"], b["masks"])


def test_augmentation_flag_controls_flips(demo_shards: Path) -> None:
    dataset = ShardDataset(f"{demo_shards}/train*", DecodeOptions(image_size=SIZE))
    plain = TrainStream(dataset, batch_size=1, seed=1, augment=False, shuffle_buffer_size=1)
    augmented = TrainStream(dataset, batch_size=1, seed=1, augment=True, shuffle_buffer_size=1)
    flips = 0
    for b in range(24):
        (image_a,), (target_a,) = plain.batch(b)
        (image_b,), (target_b,) = augmented.batch(b)
        assert target_a["image_id"] == target_b["image_id"]
        reference, _ = dataset.load(plain.sample_index(b), flip=False)
        assert torch.equal(image_a, reference)
        flips += not torch.equal(image_b, reference)
    assert 4 <= flips <= 20


def test_epoch_order_shuffle_buffer_semantics() -> None:
    sizes = [5, 5, 5, 5]
    unbuffered = epoch_order(sizes, seed=0, epoch=0, buffer_size=1)
    runs = [unbuffered[i : i + 5] for i in range(0, 20, 5)]
    assert all(run == list(range(run[0], run[0] + 5)) for run in runs), "shard runs intact"
    assert sorted(r[0] for r in runs) == [0, 5, 10, 15]
    buffered = epoch_order(sizes, seed=0, epoch=0, buffer_size=4)
    assert sorted(buffered) == list(range(20)) and buffered != unbuffered
    assert epoch_order(sizes, seed=0, epoch=1, buffer_size=4) != buffered
    assert epoch_order(sizes, seed=0, epoch=0, buffer_size=4) == buffered


def test_eval_loader_keeps_every_image_in_order_and_honours_eval_samples(
    demo_dataset, demo_shards: Path, tmp_path: Path
) -> None:
    loader = build_eval_loader(_spec(demo_shards))
    assert len(loader) == 3
    assert _ids(loader) == [[25, 26, 27], [28, 29, 30], [31, 32]]
    limited = build_eval_loader(_spec(demo_shards, eval_samples=4), with_masks=False)
    batches = list(limited)
    assert _ids(batches) == [[25, 26, 27], [28]]
    assert "masks" not in batches[0][1][0]

    document = json.loads(demo_dataset.val_json.read_text())
    document["annotations"] = [a for a in document["annotations"] if a["image_id"] != 26]
    (tmp_path / "val.json").write_text(json.dumps(document))
    convert_dataset(demo_dataset.val_images, tmp_path / "val.json", tmp_path)
    spec = _spec(tmp_path, validation_file_pattern=f"{tmp_path}/val-*")
    targets = [t for _, batch in build_eval_loader(spec) for t in batch]
    empty = next(t for t in targets if t["image_id"] == 26)
    assert empty["boxes"].shape == (0, 4) and empty["masks"].shape == (0, *SIZE)
    assert len(targets) == 8


def test_label_map_override_remaps_and_rejects_unknown(demo_shards: Path) -> None:
    shuffled = LabelMap.from_json(
        [
            {"id": 7, "name": "triangle", "label": 1},
            {"id": 3, "name": "square", "label": 2},
            {"id": 1, "name": "circle", "label": 3},
        ]
    )
    own = ShardDataset(f"{demo_shards}/val*", DecodeOptions(image_size=SIZE))
    other = ShardDataset(f"{demo_shards}/val*", DecodeOptions(image_size=SIZE), label_map=shuffled)
    for index in range(len(own)):
        labels_own, labels_other = own[index][1]["labels"], other[index][1]["labels"]
        ids_own = [own.label_map.category_id_of(int(x)) for x in labels_own]
        assert ids_own == [shuffled.category_id_of(int(x)) for x in labels_other]
    partial = LabelMap.from_json([{"id": 1, "name": "circle", "label": 1}])
    dataset = ShardDataset(f"{demo_shards}/val*", DecodeOptions(image_size=SIZE), label_map=partial)
    with pytest.raises(ValueError, match=r"^image \d+: category id [37] is not in the label map"):
        for index in range(len(dataset)):
            dataset[index]


def test_clear_errors_for_bad_patterns_and_mask_mismatch(demo_dataset, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no shards match"):
        build_train_loader(_spec(tmp_path))
    convert_dataset(
        demo_dataset.train_images, demo_dataset.train_json, tmp_path, include_masks=False
    )
    with pytest.raises(ValueError, match="converted without masks"):
        build_train_loader(_spec(tmp_path))
    spec = _spec(tmp_path).model_copy(
        update={"maskrcnn_config": MaskRCNNConfig(include_mask=False)}
    )
    _, targets = next(iter(build_train_loader(spec)))
    assert "masks" not in targets[0]


def test_workers_are_capped_by_cores(demo_shards: Path) -> None:
    import os

    loader = build_train_loader(_spec(demo_shards, n_workers=64))
    assert loader.num_workers == len(os.sched_getaffinity(0))
    assert isinstance(loader.dataset, TrainStream)
    eval_loader = build_eval_loader(_spec(demo_shards))
    assert isinstance(eval_loader.dataset, EvalStream)


def test_unset_workers_take_this_ranks_share_of_the_cores(
    demo_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = usable_cores()
    # Set in the spec (TAO: each training process's workers): kept, capped by the cores.
    assert loader_workers(0) == 0 and loader_workers(1) == 1
    assert loader_workers(cores + 5, local_ranks=8) == cores
    # Unset: the process's share of the cores, one left for the process itself.
    assert loader_workers(None, local_ranks=1) == max(1, cores - 1)
    assert loader_workers(None, local_ranks=cores) == 1
    assert loader_workers(None, local_ranks=2 * cores) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's count of this host's ranks
    assert loader_workers(None) == max(1, cores // 2 - 1)
    # TAO's sample specs leave n_workers out; the text form of a spec keeps it unset.
    unset = parse_spec_text(f"data_config {{ training_file_pattern: '{demo_shards}/train*' }}")
    assert spec_workers(unset.data_config) is None
    assert spec_workers(parse_spec_text("data_config { n_workers: 16 }").data_config) == 16
    assert build_train_loader(unset).num_workers == max(1, cores // 2 - 1)
    resolved = unset.resolve_paths(demo_shards)
    assert spec_workers(resolved.data_config) is None
    relaunched = ExperimentSpec.model_validate_json(resolved.model_dump_json(exclude_unset=True))
    assert relaunched == resolved and spec_workers(relaunched.data_config) is None


def test_iterating_a_loader_leaves_the_global_torch_rng_alone(demo_shards: Path) -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    for loader in (build_train_loader(_spec(demo_shards)), build_eval_loader(_spec(demo_shards))):
        next(iter(loader))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize(("orig", "size"), [((48, 64), (128, 192)), ((480, 640), (128, 128))])
def test_cropped_masks_resize_like_torch_nearest_exact(
    flip: bool, orig: tuple[int, int], size: tuple[int, int]
) -> None:
    """Box-cropped decoding + index sampling == full-image flip + F.interpolate."""
    generator = torch.Generator().manual_seed(0)
    height, width = orig
    full = torch.zeros((4, height, width), dtype=torch.uint8)
    for n in range(4):
        y0, x0 = (int(v) for v in torch.randint(0, height // 2, (2,), generator=generator))
        noise = torch.rand((height // 3, width // 3), generator=generator) > 0.4
        full[n, y0 : y0 + height // 3, x0 : x0 + width // 3] = noise.to(torch.uint8)
    anns = []
    for mask in full:
        rle = mask_utils.encode(np.asfortranarray(mask.numpy()))
        anns.append(_cropped_mask(rle))
    ours = _masks(anns, height, width, size, flip=flip)
    new_h, new_w = resized_hw(height, width, size)
    source = full.flip(-1) if flip else full
    expected = torch.zeros_like(ours)
    expected[:, :new_h, :new_w] = F.interpolate(
        source[None], size=(new_h, new_w), mode="nearest-exact"
    )[0]
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("size", [SIZE, (64, 96)])
def test_uint8_images_divide_to_the_float_images(demo_shards: Path, size: tuple[int, int]) -> None:
    """``uint8_images``: the same pixels, resized and padded alike, before the division by
    255 that the model then makes (bit for bit the float pipeline's), flipped or not."""
    as_float = ShardDataset(f"{demo_shards}/train*", DecodeOptions(image_size=size))
    as_uint8 = ShardDataset(
        f"{demo_shards}/train*", DecodeOptions(image_size=size, uint8_images=True)
    )
    for index, flip in [(0, False), (1, True), (2, False)]:
        image, target = as_float.load(index, flip=flip)
        raw, raw_target = as_uint8.load(index, flip=flip)
        assert raw.dtype == torch.uint8 and raw.shape == (3, *size)
        assert torch.equal(unit_range(raw), image)
        assert torch.equal(raw_target["boxes"], target["boxes"])
        assert torch.equal(raw_target["masks"], target["masks"])


def _png_rgb16(pixels: np.ndarray) -> bytes:
    """``pixels`` (``[H, W, 3]`` uint16) as a 16-bit RGB PNG (Pillow writes none)."""
    height, width, _ = pixels.shape
    rows = b"".join(b"\0" + pixels[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("uint8_images", [False, True])
def test_16_bit_png_images_decode_to_the_8_bit_range(tmp_path: Path, uint8_images: bool) -> None:
    """A 16-bit RGB PNG (kept as it is by the conversion) trains on the same 0..1 pixels
    as its 8-bit version: the high byte of each sample, as Pillow and inference read it."""
    pixels = np.random.default_rng(0).integers(0, 65536, (48, 64, 3), dtype=np.uint16)
    images = tmp_path / "images"
    images.mkdir()
    (images / "deep.png").write_bytes(_png_rgb16(pixels))
    coco = {
        "images": [{"id": 1, "file_name": "deep.png", "width": 64, "height": 48}],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "train.json").write_text(json.dumps(coco))
    convert_dataset(images, tmp_path / "train.json", tmp_path / "out", workers=1)
    options = DecodeOptions(image_size=(48, 64), uint8_images=uint8_images)
    image, _ = ShardDataset(f"{tmp_path}/out/train*", options)[0]
    expected = torch.from_numpy((pixels >> 8).astype(np.uint8)).permute(2, 0, 1)
    if uint8_images:
        assert image.dtype == torch.uint8 and torch.equal(image, expected)
    else:
        assert image.dtype == torch.float32 and torch.equal(image, expected.float() / 255)
