"""dataset_convert: validation findings, shards, manifest, label maps, CLI exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskops.cli.main import main
from maskops.data.coco import DatasetError
from maskops.data.convert import convert_dataset
from maskops.data.manifest import Manifest, load_label_map
from maskops.data.pipeline import DecodeOptions, ShardDataset, epoch_order
from maskops.data.shards import file_sha256, iter_shard

EXPECTED_WARNINGS = {
    "1": {
        "box": [102],
        "mask": [103],
        "degenerate_box": [104],
        "degenerate_polygon": [105, 107],
        "empty_mask": [106, 107],
        "bad_mask": [108, 109],
        "unknown_category": [110],
    },
    "2": {"box": [], "mask": [], "missing_file": ["missing.jpg"]},
    "5": {"box": [], "mask": [], "exif_rotated": ["orientation 6 applied"]},
    "6": {"box": [], "mask": [], "color_mode": ["L"]},
    "7": {"box": [], "mask": [], "color_mode": ["CMYK"]},
    "8": {"box": [], "mask": [], "color_mode": ["RGBA"]},
    "9": {"box": [], "mask": [], "format": ["BMP stored as PNG"]},
    "10": {"box": [1001], "mask": [], "size_mismatch": ["json 100x100, file 64x48"]},
    "11": {"box": [], "mask": [], "exif_rotated": ["orientation 6 ignored: json size is raw"]},
    "77": {"box": [], "mask": [], "missing_image": [901]},
}


def _full_mask(ann: dict, height: int, width: int) -> np.ndarray:
    """A shard annotation's box-cropped mask pasted back into its image."""
    x, y, w, h = ann["mask_box"]
    crop = mask_utils.decode({"size": [h, w], "counts": ann["mask"].encode()})
    full = np.zeros((height, width), dtype=np.uint8)
    full[y : y + h, x : x + w] = crop
    return full


def _records(out: Path, tag: str) -> dict[int, dict]:
    manifest = Manifest.load(out / f"{tag}_manifest.json")
    return {
        s.record["image_id"]: {**s.record, "_bytes": s.image_bytes}
        for path in manifest.shard_paths()
        for s in iter_shard(path)
    }


def test_every_warning_kind_is_reported_and_nothing_else(broken_dataset, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = convert_dataset(broken_dataset.image_dir, broken_dataset.annotation_file, out)
    warnings = json.loads((out / "broken_warnings.json").read_text())
    unreadable = {key: warnings.pop(key) for key in ("3", "4")}
    assert warnings == EXPECTED_WARNINGS
    assert unreadable["3"]["unreadable"][0].startswith("truncated.jpg: image file is truncated")
    assert unreadable["4"]["unreadable"][0].startswith("garbage.jpg: cannot identify image")
    assert (result.num_images, result.num_skipped_images) == (8, 3)
    assert (result.num_annotations, result.num_dropped_annotations, result.num_crowd) == (10, 8, 1)
    assert result.warning_counts["unreadable"] == 2
    assert "findings (broken_warnings.json):" in result.summary()


def test_repairs_are_applied_in_the_shards(broken_dataset, tmp_path: Path) -> None:
    convert_dataset(broken_dataset.image_dir, broken_dataset.annotation_file, tmp_path)
    records = _records(tmp_path, "broken")
    assert sorted(records) == [1, 5, 6, 7, 8, 9, 10, 11]
    assert (records[11]["width"], records[11]["height"]) == (64, 48)
    anns = {a["id"]: a for a in records[1]["annotations"]}
    assert sorted(anns) == [101, 102, 103, 104, 105, 111, 112, 113]
    assert anns[102]["bbox"] == [50.0, 10.0, 14.0, 20.0]  # clipped to the 64 px width
    assert anns[104]["bbox"] == [5.0, 5.0, 10.0, 10.0]  # degenerate box -> mask's box
    assert anns[111]["iscrowd"] == 1
    assert anns[102]["label"] == 2 and anns[101]["label"] == 1  # ids 5, 90 -> labels 1, 2
    blob = np.zeros((48, 64), dtype=np.uint8)
    blob[10:20, 30:45] = 1
    for ann_id in (111, 112):  # uncompressed and compressed RLE
        assert anns[ann_id]["mask_box"] == [30, 10, 15, 10]
        assert np.array_equal(_full_mask(anns[ann_id], 48, 64), blob)
    rotated = records[5]
    assert (rotated["width"], rotated["height"]) == (48, 64)
    assert rotated["annotations"][0]["bbox"] == [30.0, 50.0, 10.0, 10.0]
    assert records[10]["annotations"][0]["bbox"] == [50.0, 30.0, 14.0, 18.0]
    assert (records[10]["width"], records[10]["height"]) == (64, 48)
    for image_id in (6, 7, 8, 9):
        pil = Image.open(io.BytesIO(records[image_id]["_bytes"]))
        assert pil.mode == "RGB" and pil.size == (64, 48)
    alpha = np.asarray(Image.open(io.BytesIO(records[8]["_bytes"])))
    assert alpha[:, :32].max() == 0  # transparent pixels composited over black
    assert records[9]["_bytes"][:8] == b"\x89PNG\r\n\x1a\n"


def test_boxes_only_conversion_keeps_maskless_annotations(broken_dataset, tmp_path) -> None:
    result = convert_dataset(
        broken_dataset.image_dir, broken_dataset.annotation_file, tmp_path, include_masks=False
    )
    warnings = json.loads((tmp_path / "broken_warnings.json").read_text())
    assert warnings["1"] == {
        "box": [102],
        "mask": [],
        "degenerate_box": [104],
        "unknown_category": [110],
    }
    anns = _records(tmp_path, "broken")[1]["annotations"]
    assert [a["id"] for a in anns] == [101, 102, 103, 105, 106, 107, 108, 109, 111, 112, 113]
    assert all("mask" not in a for a in anns)
    assert not Manifest.load(result.manifest_path).include_masks


def test_demo_dataset_converts_with_zero_warnings(demo_dataset, demo_shards: Path) -> None:
    for split, json_path in (("train", demo_dataset.train_json), ("val", demo_dataset.val_json)):
        assert json.loads((demo_shards / f"{split}_warnings.json").read_text()) == {}
        manifest = Manifest.load(demo_shards / f"{split}_manifest.json")
        coco = COCO(str(json_path))
        assert manifest.num_images == len(coco.getImgIds())
        assert manifest.num_annotations == len(coco.getAnnIds())
        assert manifest.data["warning_counts"] == {}
        assert manifest.data["source"]["annotation_sha256"] == file_sha256(json_path)
        for info, shard in zip(manifest.shards, manifest.shard_paths(), strict=True):
            assert info.sha256 == file_sha256(shard)
            assert info.num_samples == sum(1 for _ in iter_shard(shard))
        per_category = {c["id"]: c["instances"] for c in manifest.data["categories"]}
        assert per_category == {cid: len(coco.getAnnIds(catIds=[cid])) for cid in coco.getCatIds()}
        for path in manifest.shard_paths():
            for sample in iter_shard(path):
                for ann in sample.record["annotations"]:
                    original = coco.loadAnns(ann["id"])[0]
                    full = _full_mask(ann, 128, 128)
                    assert np.array_equal(full, coco.annToMask(original))
                    assert ann["bbox"] == original["bbox"]
                    assert ann["category_id"] == original["category_id"]


def test_label_map_round_trip_through_manifest(demo_shards: Path) -> None:
    label_map = load_label_map(f"{demo_shards}/train*")
    assert [(c.id, c.name, c.label) for c in label_map.categories] == [
        (1, "circle", 1),
        (3, "square", 2),
        (7, "triangle", 3),
    ]
    assert [label_map.category_id_of(label) for label in (1, 2, 3)] == [1, 3, 7]
    assert load_label_map(demo_shards / "val-00000-of-00001.tar") == label_map


def test_image_and_annotation_ids_from_zero(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "a.jpg")
    document = {
        "images": [{"id": 0, "file_name": "a.jpg", "width": 32, "height": 32}],
        "annotations": [
            {
                "id": 0,
                "image_id": 0,
                "category_id": 0,
                "bbox": [1, 1, 40, 8],
                "segmentation": [[1, 1, 9, 1, 9, 9, 1, 9]],
                "iscrowd": 0,
            }
        ],
        "categories": [{"id": 0, "name": "zero"}],
    }
    (tmp_path / "z.json").write_text(json.dumps(document))
    convert_dataset(tmp_path, tmp_path / "z.json", tmp_path / "out")
    records = _records(tmp_path / "out", "z")
    assert list(records) == [0]
    assert records[0]["annotations"][0]["id"] == 0
    assert records[0]["annotations"][0]["label"] == 1
    warnings = json.loads((tmp_path / "out" / "z_warnings.json").read_text())
    assert warnings == {"0": {"box": [0], "mask": []}}


def test_shard_count_is_capped_and_stale_shards_replaced(demo_dataset, tmp_path: Path) -> None:
    first = convert_dataset(
        demo_dataset.train_images, demo_dataset.train_json, tmp_path, tag="t", num_shards=1
    )
    assert [p.name for p in first.shards] == ["t-00000-of-00001.tar"]
    more = convert_dataset(
        demo_dataset.train_images,
        demo_dataset.train_json,
        tmp_path,
        tag="t",
        workers=2,
        num_shards=256,
    )  # 24 images: capped at 24 // 16 = 1 shard
    assert len(more.shards) == 1
    assert sorted(p.name for p in tmp_path.glob("t-*")) == ["t-00000-of-00001.tar"]
    assert more.shards[0].read_bytes() == first.shards[0].read_bytes()  # deterministic


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"images": [}', "invalid JSON at line 1 column 13"),
        ("[]", "top level must be an object, got list"),
        ('{"images": [], "categories": [{"id": 1}]}', "images: empty"),
        ('{"images": [{"id": 1}], "categories": []}', "images[0].file_name: expected"),
        (
            '{"images": [{"id": 1, "file_name": "a"}, {"id": 1, "file_name": "b"}],'
            ' "categories": [{"id": 1}]}',
            "images[1].id: duplicate id 1 (also images[0])",
        ),
        (
            '{"images": [{"id": 1, "file_name": "a"}], "categories": [{"id": 1}],'
            ' "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3]}]}',
            "annotations[0].bbox: expected 4 numbers",
        ),
        (
            '{"images": [{"id": "x", "file_name": "a"}], "categories": [{"id": 1}]}',
            "images[0].id: expected an integer, got 'x'",
        ),
        (
            '{"images": [{"id": 1, "file_name": "a"}], "categories": [{"id": 1}],'
            ' "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4],'
            ' "segmentation": {"size": [1e400, 64], "counts": "PP"}}]}',
            "annotations[0].segmentation.size: expected [height, width], got [inf, 64]",
        ),
        (
            '{"images": [{"id": 1, "file_name": "a"}], "categories": [{"id": 1}],'
            ' "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4],'
            ' "segmentation": {"size": [48.5, 64], "counts": "PP"}}]}',
            "annotations[0].segmentation.size: expected [height, width], got [48.5, 64]",
        ),
    ],
)
def test_malformed_json_names_key_and_index(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(DatasetError, match=r"^bad\.json: ") as info:
        convert_dataset(tmp_path, tmp_path / "bad.json", tmp_path / "out")
    assert message in str(info.value)


def test_cli_exit_codes_and_summary(broken_dataset, tmp_path, capsys) -> None:
    args = ["dataset_convert", "-i", str(broken_dataset.image_dir), "-o", str(tmp_path / "o")]
    assert main([*args, "-a", str(broken_dataset.annotation_file), "-t", "x"]) == 0
    out = capsys.readouterr().out
    assert "8 written, 3 skipped" in out and "unknown_category" in out
    assert (tmp_path / "o" / "x-00000-of-00001.tar").is_file()

    nothing = dict(broken_dataset.document)
    nothing["images"] = [im for im in nothing["images"] if im["id"] in (2, 3, 4)]
    (tmp_path / "nothing.json").write_text(json.dumps(nothing))
    assert main([*args, "-a", str(tmp_path / "nothing.json")]) == 2
    # Off a terminal progress comes as whole lines, then the error, on one line.
    *progress, error = capsys.readouterr().err.strip().splitlines()
    assert "no usable image: all 3 were skipped" in error
    assert all(line.startswith("convert: ") for line in progress)
    assert not list((tmp_path / "o").glob("nothing-*.tar"))


def test_cli_runs_as_a_program(demo_dataset, tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "maskops.cli.main",
        "dataset_convert",
        "-k",
        "key",
        "-i",
        str(demo_dataset.val_images),
        "-a",
        str(demo_dataset.val_json),
        "-o",
        str(tmp_path),
        "--no-include_mask",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "8 written, 0 skipped" in done.stdout
    assert "-k/--key is ignored" in done.stderr
    assert not Manifest.load(tmp_path / "val_manifest.json").include_masks


def test_missing_inputs_fail_with_one_line(tmp_path: Path, capsys) -> None:
    base = ["dataset_convert", "-o", str(tmp_path / "o")]
    assert main([*base, "-i", str(tmp_path / "nope"), "-a", str(tmp_path / "a.json")]) == 2
    assert "nope: image directory does not exist" in capsys.readouterr().err
    assert main([*base, "-i", str(tmp_path), "-a", str(tmp_path / "a.json")]) == 2
    assert "a.json: cannot read: No such file or directory" in capsys.readouterr().err
    assert main([*base, "-i", str(tmp_path), "-a", str(tmp_path / "a.json"), "-s", "0"]) == 2
    assert "num_shards must be >= 1" in capsys.readouterr().err


def test_conversion_streams_images(demo_dataset, tmp_path: Path) -> None:
    """Memory in use stays flat while images are written: nothing accumulates per image."""
    source = json.loads(demo_dataset.train_json.read_text())
    copies = 5
    document: dict = {**source, "images": [], "annotations": []}
    for copy in range(copies):
        offset = 1000 * copy
        for image in source["images"]:
            document["images"].append({**image, "id": image["id"] + offset})
        for ann in source["annotations"]:
            moved = {**ann, "id": ann["id"] + offset, "image_id": ann["image_id"] + offset}
            document["annotations"].append(moved)
    path = tmp_path / "many.json"
    path.write_text(json.dumps(document))
    in_use: list[int] = []
    calls: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total))
        in_use.append(tracemalloc.get_traced_memory()[0])

    tracemalloc.start()
    try:
        result = convert_dataset(
            demo_dataset.train_images, path, tmp_path / "out", workers=1, progress=progress
        )
    finally:
        tracemalloc.stop()
    total = 24 * copies
    assert calls == [(done, total) for done in range(1, total + 1)]
    written = sum(p.stat().st_size for p in result.shards)
    growth = max(in_use[total // 2 :]) - in_use[total // 5]
    assert growth < written / 10, (growth, written)


def test_a_shard_whose_images_are_all_missing_is_written_empty(demo_dataset, tmp_path) -> None:
    document = json.loads(demo_dataset.train_json.read_text())
    images = document["images"]
    extra = [{**im, "id": im["id"] + 100, "file_name": "gone/" + im["file_name"]} for im in images]
    document["images"] = images[:16] + extra[:16] + images[16:] + extra[16:]  # 48 -> 3 shards
    (tmp_path / "holes.json").write_text(json.dumps(document))
    result = convert_dataset(demo_dataset.train_images, tmp_path / "holes.json", tmp_path / "o")
    manifest = Manifest.load(result.manifest_path)
    assert [s.num_samples for s in manifest.shards] == [16, 0, 8]
    assert result.num_skipped_images == 24 and result.warning_counts == {"missing_file": 24}
    assert [sum(1 for _ in iter_shard(p)) for p in manifest.shard_paths()] == [16, 0, 8]
    dataset = ShardDataset(tmp_path / "o", DecodeOptions(image_size=(128, 128)))
    assert dataset.shard_sizes == [16, 0, 8]
    assert sorted(epoch_order(dataset.shard_sizes, seed=0, epoch=0, buffer_size=4)) == list(
        range(24)
    )


def test_an_unexpected_failure_skips_only_that_image(demo_dataset, tmp_path, monkeypatch) -> None:
    """The safety net for bugs: nothing real triggers it, so a failure is injected."""
    import maskops.data.convert as convert_module

    real = convert_module.process_image

    def failing_on_image_2(image, annotations, **kwargs):
        if image.id == 2:
            raise IndexError("boom")
        return real(image, annotations, **kwargs)

    monkeypatch.setattr(convert_module, "process_image", failing_on_image_2)
    result = convert_dataset(
        demo_dataset.train_images, demo_dataset.train_json, tmp_path, workers=1
    )
    assert (result.num_images, result.num_skipped_images) == (23, 1)
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings == {"2": {"box": [], "mask": [], "error": ["000002.jpg: IndexError: boom"]}}


def test_file_names_leaving_the_image_dir_are_refused_unopened(tmp_path: Path, monkeypatch) -> None:
    """Absolute names, ``..`` and links out of the image directory are ``unsafe_path``
    faults naming the record, the same whether the target exists or not (no existence
    oracle), and nothing of the target reaches the shards; only regular files up to the
    size limit are read (a FIFO would block a plain ``open``)."""
    import os

    import maskops.data.validate as validate

    images = tmp_path / "images"
    images.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.fromarray(np.full((24, 32, 3), 200, dtype=np.uint8)).save(outside / "secret.png")
    Image.fromarray(np.full((24, 32, 3), 10, dtype=np.uint8)).save(images / "good.png")
    (images / "link.png").symlink_to(outside / "secret.png")
    os.mkfifo(images / "pipe.png")
    (images / "big.png").write_bytes((images / "good.png").read_bytes() + b"\0" * 4096)
    names = {
        1: "good.png",
        2: str(outside / "secret.png"),
        3: "../outside/secret.png",
        4: "/etc/hostname",
        5: "/proc/self/environ",
        6: "/root/.ssh/id_rsa",
        7: "link.png",
        8: "sub/../../outside/secret.png",
        9: "pipe.png",
        10: "big.png",
        11: "..\\outside\\secret.png",
    }
    coco = {
        "images": [{"id": i, "file_name": n} for i, n in names.items()],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    monkeypatch.setattr(validate, "MAX_IMAGE_FILE_BYTES", 2048)
    out = tmp_path / "out"
    convert_dataset(images, tmp_path / "coco.json", out, workers=1)
    warnings = json.loads((out / "coco_warnings.json").read_text())
    for image_id in (2, 3, 4, 5, 6, 7, 8, 11):
        assert warnings[str(image_id)] == {"box": [], "mask": [], "unsafe_path": [names[image_id]]}
    assert warnings["9"]["unreadable"] == ["pipe.png: not a regular file"]
    assert warnings["10"]["unreadable"] == ["big.png: larger than the limit of 2048 bytes"]
    assert "1" not in warnings
    stored = _records(out, "coco")
    assert set(stored) == {1}
    secret = (outside / "secret.png").read_bytes()
    assert all(secret not in path.read_bytes() for path in out.iterdir())


def test_a_directory_named_as_an_image_is_unreadable(tmp_path: Path) -> None:
    """A directory where an image should be is an unreadable image, not a maskops error."""
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.full((24, 32, 3), 10, dtype=np.uint8)).save(images / "good.png")
    (images / "folder.png").mkdir()
    coco = {
        "images": [{"id": 1, "file_name": "good.png"}, {"id": 2, "file_name": "folder.png"}],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    result = convert_dataset(images, tmp_path / "coco.json", tmp_path / "out", workers=1)
    warnings = json.loads(result.warnings_path.read_text())
    assert warnings == {
        "2": {"box": [], "mask": [], "unreadable": ["folder.png: not a regular file"]}
    }
    assert result.num_images == 1 and result.num_skipped_images == 1
