"""Reading user images (modes, EXIF orientation, bad files) and drawing detections."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from PIL import Image

from maskops.evaluation.errors import ImageReadError
from maskops.evaluation.images import list_images, read_image
from maskops.evaluation.visualize import MASK_ALPHA, draw_detections, instance_colour


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    # Stored 40 wide x 20 high, left half red; orientation 6 = "rotate 90 degrees clockwise
    # to display", so the upright image is 20 wide x 40 high with red on top.
    stored = np.zeros((20, 40, 3), dtype=np.uint8)
    stored[:, :20, 0] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "phone.jpg"
    Image.fromarray(stored).save(path, exif=exif.tobytes(), quality=100)

    image = read_image(path)
    assert image.shape == (3, 40, 20)
    assert image[0, :15].float().mean() > 200 and image[0, 25:].float().mean() < 50


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "LA", "I;16", "CMYK", "1"])
def test_any_mode_becomes_rgb(tmp_path: Path, mode: str) -> None:
    rgb = Image.fromarray(np.full((12, 16, 3), 200, dtype=np.uint8))
    image = rgb.convert("L").convert(mode) if mode in ("I;16", "1") else rgb.convert(mode)
    if mode == "I;16":
        image = Image.fromarray(np.full((12, 16), 50000, dtype=np.uint16))
    path = tmp_path / ("x.jpg" if mode in ("L", "CMYK") else "x.png")
    image.save(path)
    tensor = read_image(path)
    assert tensor.shape == (3, 12, 16) and tensor.dtype == torch.uint8
    assert tensor.float().mean() > 150  # bright stays bright (16-bit scaled, not clipped)


def test_unreadable_files_fail_with_their_name(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ImageReadError, match=r"broken.jpg: unreadable image"):
        read_image(broken)
    gif = tmp_path / "anim.png"
    Image.new("RGB", (4, 4)).save(gif, format="GIF")
    with pytest.raises(ImageReadError, match=r"anim.png: GIF images are not supported"):
        read_image(gif)
    with pytest.raises(ImageReadError, match=r"absent.png: file not found"):
        read_image(tmp_path / "absent.png")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden.jpg").write_text("x")
    images, others = list_images(tmp_path)
    assert [p.name for p in images] == ["anim.png", "broken.jpg"]
    assert [p.name for p in others] == ["notes.txt"]


def _detection(h: int, w: int) -> tuple[dict, np.ndarray]:
    mask = np.zeros((h, w), dtype=np.uint8)
    mask[30:70, 40:100] = 1  # the mask, inside a larger box
    mask[30:45, 40:60] = 0  # with a notch, so "inside the box" differs from "inside the mask"
    rle = mask_util.encode(np.asfortranarray(mask))
    det = {
        "image_id": 1,
        "category_id": 7,
        "bbox": [35.0, 25.0, 75.0, 55.0],
        "score": 0.87,
        "segmentation": {"size": [h, w], "counts": rle["counts"].decode()},
    }
    return det, mask.astype(bool)


@pytest.mark.parametrize("background", [15, 240])
def test_mask_colour_inside_the_mask_and_not_outside(background: int) -> None:
    h, w = 120, 160
    image = Image.fromarray(np.full((h, w, 3), background, dtype=np.uint8))
    det, mask = _detection(h, w)
    drawn = np.asarray(
        draw_detections(image, [det], category_names={7: "triangle"}, include_mask=True)
    ).astype(float)
    colour = np.asarray(instance_colour(0), dtype=float)
    tinted = background * (1 - MASK_ALPHA) + colour * MASK_ALPHA

    interior = mask.copy()
    interior[:, :] = False
    interior[50:66, 45:95] = True  # well inside the mask: away from outline, box and label
    assert np.abs(drawn[interior] - tinted).max() <= 1.0
    notch = np.zeros_like(mask)
    notch[33:42, 43:57] = True  # inside the box, outside the mask
    assert np.abs(drawn[notch] - background).max() == 0
    far = np.zeros_like(mask)
    far[90:, :] = True  # below the box
    assert np.abs(drawn[far] - background).max() == 0
    # The mask outline is drawn at full colour, and differs clearly from the background.
    assert np.abs(drawn[40, 99] - colour).max() == 0
    assert np.abs(colour - background).max() > 100
    # Without --include_mask the interior is untouched (only box and label are drawn).
    plain = np.asarray(draw_detections(image, [det], category_names={7: "triangle"}))
    assert np.abs(plain[interior].astype(float) - background).max() == 0
    assert np.abs(plain[40, 35].astype(float) - colour).max() == 0  # box edge


def test_instance_colours_are_distinct() -> None:
    colours = [np.asarray(instance_colour(i), dtype=float) for i in range(12)]
    gaps = [np.abs(a - b).max() for i, a in enumerate(colours) for b in colours[i + 1 :]]
    assert min(gaps) > 20
