"""The synthetic demo dataset: valid COCO, exact masks, deterministic, and the CLI."""

from __future__ import annotations

import colorsys
import hashlib
from pathlib import Path

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskops.cli.main import main
from maskops.data.demo import (
    CATEGORIES,
    DEMO_WALK_LAYOUT,
    Polygon,
    ShapeLayout,
    _kept,
    _Layout,
    _Occluder,
    _placed_over,
    _random_shape,
    draw_image,
    generate_demo_dataset,
)

CROWDED = ShapeLayout(min_shapes=8, max_shapes=14, min_radius=0.05, max_radius=0.25)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_every_mask_decodes_to_its_polygons_in_pycocotools(demo_dataset) -> None:
    for json_path, count in ((demo_dataset.train_json, 24), (demo_dataset.val_json, 8)):
        coco = COCO(str(json_path))
        assert len(coco.getImgIds()) == count
        assert sorted(coco.getCatIds()) == [1, 3, 7]
        anns = coco.loadAnns(coco.getAnnIds())
        assert anns, "every split has instances"
        for image_id in coco.getImgIds():
            info = coco.loadImgs(image_id)[0]
            claimed = np.zeros((info["height"], info["width"]), dtype=np.uint8)
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id)):
                assert ann["iscrowd"] == 0
                assert all(len(p) >= 6 and len(p) % 2 == 0 for p in ann["segmentation"])
                mask = coco.annToMask(ann)
                rle = mask_utils.encode(np.asfortranarray(mask))
                assert ann["area"] == mask.sum() > 0
                assert ann["bbox"] == [float(v) for v in mask_utils.toBbox(rle)]
                assert not (claimed & mask).any(), "visible parts never overlap"
                claimed |= mask


@pytest.mark.parametrize("index", range(12))
def test_drawn_pixels_are_exactly_the_decoded_masks(index: int) -> None:
    """Without noise, an instance's colour covers exactly its decoded mask in its box."""
    drawn = draw_image(np.random.default_rng([7, index]), 96, 128, noise=0.0)
    for ann, color in zip(drawn.annotations, drawn.colors, strict=True):
        rles = mask_utils.frPyObjects(ann["segmentation"], 96, 128)
        mask = mask_utils.decode(mask_utils.merge(rles)).astype(bool)
        x, y, w, h = (int(v) for v in ann["bbox"])
        painted = (drawn.pixels == np.array(color, dtype=np.uint8)).all(axis=2)
        assert np.array_equal(painted[y : y + h, x : x + w], mask[y : y + h, x : x + w])
        assert mask.sum() == mask[y : y + h, x : x + w].sum()


def test_hue_by_class_draws_each_class_in_its_own_band_of_hues() -> None:
    """Circles red, squares green, triangles blue, each within 20 degrees of its hue; a
    layout without it draws every class in hues all round the circle."""
    centres = {1: 0.0, 3: 120.0, 7: 240.0}
    offsets: dict[bool, dict[int, list[float]]] = {True: {}, False: {}}
    for by_class in (True, False):
        layout = ShapeLayout(max_shapes=3, hue_by_class=by_class)
        for index in range(30):
            drawn = draw_image(np.random.default_rng([5, index]), 96, 96, layout=layout)
            for ann, color in zip(drawn.annotations, drawn.colors, strict=True):
                hue = colorsys.rgb_to_hsv(*(c / 255 for c in color))[0] * 360
                offset = (hue - centres[ann["category_id"]] + 180) % 360 - 180
                offsets[by_class].setdefault(ann["category_id"], []).append(abs(offset))
    assert sorted(offsets[True]) == [1, 3, 7]
    # Rounding the colour to whole RGB values moves its hue by under a degree.
    assert max(max(v) for v in offsets[True].values()) <= 21
    assert max(max(v) for v in offsets[False].values()) > 60
    assert DEMO_WALK_LAYOUT.hue_by_class


def test_occluded_shapes_are_multi_polygon_visible_parts() -> None:
    occluded = [
        ann
        for index in range(40)
        for ann in draw_image(np.random.default_rng([0, index]), 128, 128).annotations
        if len(ann["segmentation"]) > 1
    ]
    assert occluded, "40 images hold at least one occluded (multi-polygon) shape"


def test_the_worker_count_changes_no_file(tmp_path: Path) -> None:
    one, two = (
        generate_demo_dataset(
            tmp_path / name, num_images=5, image_size=(96, 128), seed=2, layout=CROWDED, workers=n
        )
        for name, n in (("one", 1), ("two", 2))
    )
    assert _digest(one.root) == _digest(two.root)


def _plain_cut(subject: Polygon, clip: Polygon) -> list[Polygon]:
    """The difference of two convex polygons by clipping at every edge, no shortcut."""
    return _Occluder.of(clip).clip_from(subject, 0)


def test_a_cut_is_the_plain_clip_of_every_edge_and_keeps_an_untouched_shape_itself() -> None:
    rng = np.random.default_rng(5)
    background = np.full((96, 96, 3), 128.0, dtype=np.float32)
    kinds = {"clear": 0, "under": 0, "cut": 0}
    for _ in range(400):
        subject, clip = (_random_shape(rng, 96, 96, background, CROWDED).polygon for _ in "ab")
        pieces = _Occluder.of(clip).cut(subject)
        assert pieces == _plain_cut(subject, clip)
        if pieces == [subject]:
            assert pieces[0] is subject  # what lets a layout keep that shape's mask
            kinds["clear"] += 1
        else:
            kinds["under" if not pieces else "cut"] += 1
    assert all(kinds.values()), kinds  # each way a cut can go was met


def test_each_shape_keeps_its_pieces_as_clipped_afresh_by_every_later_shape() -> None:
    """A layout carries each shape's pieces from one placement to the next; they are
    the pieces that clipping it by all the shapes drawn over it gives."""
    rng = np.random.default_rng(9)
    background = np.full((96, 128, 3), 128.0, dtype=np.float32)
    layout = _Layout([], [], [], [], [])
    for _ in range(60):
        candidate = _random_shape(rng, 96, 128, background, CROWDED)
        layout = _placed_over(layout, candidate, 96, 128) or layout
    assert len(layout.shapes) >= 4
    for index, shape in enumerate(layout.shapes):
        pieces = [shape.polygon]
        for later in layout.shapes[index + 1 :]:
            pieces = [part for piece in pieces for part in _plain_cut(piece, later.polygon)]
        assert layout.pieces[index] == pieces
        assert layout.kept[index] == _kept(pieces)


def test_same_seed_same_files_other_seed_other_files(tmp_path: Path) -> None:
    a = generate_demo_dataset(tmp_path / "a", num_images=6, image_size=(64, 96), seed=3)
    b = generate_demo_dataset(tmp_path / "b", num_images=6, image_size=(64, 96), seed=3)
    c = generate_demo_dataset(tmp_path / "c", num_images=6, image_size=(64, 96), seed=4)
    assert _digest(a.root) == _digest(b.root)
    assert _digest(a.root) != _digest(c.root)
    assert (a.num_train, a.num_val) == (5, 1)


def test_categories_are_non_contiguous_and_all_drawn(demo_dataset) -> None:
    coco = COCO(str(demo_dataset.train_json))
    assert [c["id"] for c in CATEGORIES] == [1, 3, 7]
    drawn = {a["category_id"] for a in coco.loadAnns(coco.getAnnIds())}
    assert drawn == {1, 3, 7}


def test_cli_writes_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo-data", "-o", str(out), "--images", "5", "--size", "64", "80"]) == 0
    assert "wrote 4 train images" in capsys.readouterr().out
    coco = COCO(str(out / "annotations" / "val.json"))
    image = coco.loadImgs(coco.getImgIds())[0]
    assert (image["height"], image["width"]) == (64, 80)
    assert (out / "images" / "val" / image["file_name"]).is_file()


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo-data", "-o", str(tmp_path), "--images", "1"]) == 2
    assert "num_images must be >= 2" in capsys.readouterr().err
    assert main(["demo-data", "-o", str(tmp_path), "--size", "16", "64"]) == 2
    assert "image_size sides must be >= 32" in capsys.readouterr().err
