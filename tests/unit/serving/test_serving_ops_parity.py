"""The Triton models' numpy processing against the engine's in-process torch functions.

``maskops_serving_ops`` (numpy, Pillow, pycocotools; what the Triton image runs) must give
what ``maskops.serving.processing`` (``read_image`` + ``resize_and_pad``;
``detections_to_coco``) gives in process. Measured bounds (seed-fixed inputs below):

- preprocessing: bit-identical network inputs (the uint8 antialiased resize is torch's
  integer kernel re-done in numpy), for upscales, downscales and every image mode.
  JPEGs at least 4x larger than the model's input are decoded reduced, and any image at
  least 8x larger is box-averaged by whole factors: within 6 grey levels (0.5 on
  average) of the full-size resize.
- boxes and scores: identical (the same float32 operations).
- masks: the numpy bilinear paste differs from torch's compiled kernel by at most 2**-23
  (one float32 ulp at 0.5) on ~0.8% of the interpolated values (where the compiled kernel
  fuses multiply-adds), which changes a pixel only when its probability is within 1.2e-7
  of the 0.5 threshold. On the inputs below all 290 RLEs are identical; the test allows a
  per-detection IoU >= 0.999 for such pixels and requires 99% identical RLEs.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from maskops.data.labels import LabelMap
from maskops.evaluation.errors import ImageReadError
from maskops.export import graph
from maskops.serving import protocol
from maskops.serving.processing import coco_results, preprocess_image, unpad_detections
from maskops.serving.repository import OPS_FILE
from tests.conftest import large_jpeg

LABELS = LabelMap.from_coco_categories(
    [{"id": 3, "name": "square"}, {"id": 7, "name": "tri"}, {"id": 9, "name": "circle"}]
)


def _encode(array: np.ndarray, fmt: str = "PNG", mode: str | None = None, **save: object) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def _photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Noise plus smooth structure (noise alone hides averaging errors, smooth hides others)."""
    smooth = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize(
        (width, height), Image.Resampling.BICUBIC
    )
    noise = rng.integers(-40, 41, (height, width, 3))
    return np.clip(np.asarray(smooth, dtype=np.int64) + noise, 0, 255).astype(np.uint8)


def test_tensor_names_agree(ops):
    assert ops.NET_INPUT == protocol.NET_INPUT == graph.INPUT_NAME
    assert ops.NET_OUTPUTS == protocol.NET_OUTPUTS == graph.OUTPUT_NAMES
    for name in ("IMAGE_BYTES", "SCORE_THRESHOLD", "DETECTIONS_JSON", "SCALE", "ORIG_HW"):
        assert getattr(ops, name) == getattr(protocol, name)


SIZES = [(480, 640), (37, 301), (300, 40), (128, 128), (64, 96), (1, 1), (2000, 900), (96, 97)]


@pytest.mark.parametrize("orig_hw", SIZES)
@pytest.mark.parametrize("image_size", [(128, 128), (64, 96), (333, 200)])
def test_preprocess_is_bit_identical(ops, orig_hw, image_size):
    rng = np.random.default_rng(orig_hw[0] * 7 + orig_hw[1])
    data = _encode(_photo(rng, *orig_hw))
    want_image, want_scale, want_hw = preprocess_image(data, image_size)
    got_image, got_scale, got_hw = ops.preprocess(data, image_size)
    assert got_hw == want_hw and got_scale == want_scale
    assert got_image.dtype == np.float32 and got_image.shape == want_image.shape
    if ops.load_rgb(data, fit=image_size)[0].shape[:2] == orig_hw:
        np.testing.assert_array_equal(got_image, want_image)
    else:  # at least 8x the resized size: box-reduced first
        grey_levels = np.abs(got_image - want_image) * 255
        assert grey_levels.max() <= 6 and grey_levels.mean() <= 0.5, (
            grey_levels.max(),
            grey_levels.mean(),
        )


def _exif_rotated_jpeg(rng: np.random.Generator) -> bytes:
    image = Image.fromarray(_photo(rng, 40, 70))
    exif = image.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    return buffer.getvalue()


def test_preprocess_decodes_like_the_engine(ops):
    rng = np.random.default_rng(1)
    rgb = _photo(rng, 50, 80)
    grey16 = (rng.integers(0, 65536, (30, 20))).astype(np.uint16)
    encoded = {
        "jpeg": _encode(rgb, "JPEG", quality=90),
        "exif rotated": _exif_rotated_jpeg(rng),
        "grey": _encode(rgb, mode="L"),
        "palette": _encode(rgb, mode="P"),
        "rgba": _encode(rgb, mode="RGBA"),
        "cmyk jpeg": _encode(rgb, "JPEG", mode="CMYK"),
        "16-bit": _encode(grey16),
    }
    for kind, data in encoded.items():
        want = preprocess_image(data, (64, 96))
        got = ops.preprocess(data, (64, 96))
        assert got[1:] == want[1:], kind
        np.testing.assert_array_equal(got[0], want[0], err_msg=kind)
    assert ops.preprocess(encoded["exif rotated"], (64, 96))[2] == (70, 40)


@pytest.mark.parametrize("rotated", [False, True])
def test_large_jpegs_decode_reduced_close_to_the_full_decode(ops, rotated):
    data = large_jpeg(1600, 1200, seed=11, rotated=rotated)
    upright_hw = (1600, 1200) if rotated else (1200, 1600)
    # 1600 // (2 x 128) = 6: libjpeg's 1/4 is the largest reduction keeping the margin.
    reduced, full_hw = ops.load_rgb(data, fit=(128, 128))
    assert full_hw == upright_hw and reduced.shape[:2] == (upright_hw[0] // 4, upright_hw[1] // 4)
    want_image, want_scale, want_hw = preprocess_image(data, (128, 128))  # the full decode
    got_image, got_scale, got_hw = ops.preprocess(data, (128, 128))
    assert (got_scale, got_hw) == (want_scale, want_hw)
    # Measured: at most 2 grey levels here, 4 on noisy photos, 0.2-0.4 on average.
    grey_levels = np.abs(got_image - want_image) * 255
    assert grey_levels.max() <= 6 and grey_levels.mean() <= 0.5


DECODE_GROWTH = """
import importlib.util, io, sys
from pathlib import Path
from PIL import Image
from tests.conftest import PeakRss

spec = importlib.util.spec_from_file_location("ops", sys.argv[1])
ops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ops)
small = io.BytesIO()
Image.new("RGB", (64, 64)).save(small, format="JPEG")
ops.preprocess(small.getvalue(), (128, 128))  # Pillow's JPEG plugin loaded and warm
data = Path(sys.argv[2]).read_bytes()
with PeakRss() as growth:
    if sys.argv[3] == "reduced":
        ops.preprocess(data, (128, 128))
    else:
        ops.load_rgb(data)
print(growth.grew_mb)
"""


def _decode_growth_mb(image: Path, how: str) -> float:
    """Peak RSS growth of one decode in a fresh process: in a long test session malloc
    reuses memory earlier tests freed, which hides growth (a full decode once measured 50
    of its ~120 MB there)."""
    done = subprocess.run(
        [sys.executable, "-c", DECODE_GROWTH, str(OPS_FILE), str(image), how],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    return float(done.stdout.split()[-1])


@pytest.mark.parametrize(
    ("hw", "fit", "reduced_hw"),
    [
        ((1, 5_000_000), (512, 512), (1, 2049)),  # weights of 80 MB and 10 s without
        ((9000, 2000), (512, 512), (2250, 500)),
        ((2000, 3000), (128, 128), (400, 600)),
    ],
)
def test_large_images_are_reduced_before_resizing(ops, hw, fit, reduced_hw) -> None:
    """PNGs (no draft mode) too: what reaches the antialiased resize is less than twice
    ``REDUCE_MARGIN`` times the resized size, whatever the input's sides, so the resize
    costs in proportion to the output."""
    data = _encode(np.full((*hw, 3), 90, dtype=np.uint8))
    image, full_hw = ops.load_rgb(data, fit=fit)
    assert full_hw == hw and image.shape[:2] == reduced_hw
    tensor, scale, _ = ops.preprocess(data, fit)
    want, want_scale, _ = preprocess_image(data, fit) if hw[0] > 1 else (tensor, scale, hw)
    assert scale == want_scale and np.abs(tensor - want).max() * 255 <= 1


def test_large_jpeg_decode_memory_is_bounded(tmp_path: Path) -> None:
    """17 MP: about 120 MB decoded in full (Pillow's 4 bytes a pixel, then the RGB array);
    decoded at 1/8 for a 128 px model it needs a few MB."""
    image = tmp_path / "large.jpg"
    image.write_bytes(large_jpeg(4800, 3600, seed=12))
    reduced, full = _decode_growth_mb(image, "reduced"), _decode_growth_mb(image, "full")
    assert reduced < 10 and full > 100, (reduced, full)  # full: the control


def test_undecodable_images_are_named(ops):
    gif = _encode(np.zeros((4, 4, 3), np.uint8), "GIF")
    for data, message in ((b"not an image", "unreadable image"), (gif, "not supported")):
        with pytest.raises(ops.ImageDecodeError, match=f"upload 3: .*{message}"):
            ops.preprocess(data, (64, 96), name="upload 3")
        with pytest.raises(ImageReadError, match=message):
            preprocess_image(data, (64, 96))


def test_bilinear_resize_within_one_ulp_of_threshold(ops):
    rng = np.random.default_rng(2)
    equal = total = 0
    for _ in range(200):
        probs = rng.random((30, 30), dtype=np.float32)
        size = (int(rng.integers(1, 200)), int(rng.integers(1, 200)))
        want = F.interpolate(
            torch.from_numpy(probs)[None, None], size=size, mode="bilinear", align_corners=False
        )[0, 0].numpy()
        got = ops.resize_bilinear(probs, size)
        assert got.dtype == np.float32
        # One ulp of values in [0.5, 1): the pixels that can flip are those at 0.5.
        np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-23)
        equal += int((got == want).sum())
        total += want.size
    # Measured 99.2% here; the rest is where torch's build fuses multiply-adds differently.
    assert equal / total >= 0.95


def _detections(rng: np.random.Generator, d: int, m: int, frame: tuple[int, int]):
    """Padded graph outputs: boxes anywhere in (and past) the frame, smooth mask maps."""
    n = int(rng.integers(0, d + 1))
    h, w = frame
    boxes = np.zeros((d, 4), np.float32)
    x0 = rng.uniform(-5, w, n)
    y0 = rng.uniform(-5, h, n)
    bw = rng.uniform(0.3, w / 2, n)
    bh = rng.uniform(0.3, h / 2, n)
    boxes[:n] = np.stack([x0, y0, x0 + bw, y0 + bh], axis=1)
    scores = np.zeros(d, np.float32)
    scores[:n] = np.sort(rng.random(n, dtype=np.float32))[::-1]
    labels = np.zeros(d, np.int64)
    labels[:n] = rng.integers(1, len(LABELS) + 1, n)
    coarse = torch.from_numpy(rng.random((d, 1, 5, 5), dtype=np.float32))
    masks = F.interpolate(coarse, size=(m, m), mode="bilinear", align_corners=False)[:, 0].numpy()
    return boxes, scores, labels, masks, np.array([n], np.int32)


def _iou(a: dict, b: dict) -> float:
    return float(mask_util.iou([a], [b], [False])[0][0])


def test_postprocess_matches_detections_to_coco(ops):
    rng = np.random.default_rng(3)
    categories = ops.categories_from_label_map(LABELS.to_json())
    detections = identical = outside = 0
    for trial in range(80):
        frame = (128, 128) if trial % 2 else (64, 96)
        orig_hw = (int(rng.integers(20, 700)), int(rng.integers(20, 700)))
        scale = min(frame[0] / orig_hw[0], frame[1] / orig_hw[1])
        m = 28 if trial % 3 else 14
        outputs = _detections(rng, 12, m, frame)
        threshold = float(rng.choice([0.0, 0.3, 0.5]))
        want = coco_results(
            unpad_detections(*outputs),
            scale=scale,
            orig_hw=orig_hw,
            label_map=LABELS,
            score_threshold=threshold,
        )
        # Triton carries the scale as FP32, the engine as a Python float.
        got = ops.detections_to_coco(
            *ops.unpad(*outputs),
            scale=float(np.float32(scale)),
            orig_hw=orig_hw,
            categories=categories,
            score_threshold=threshold,
        )
        assert len(got) == len(want)
        outside += int((outputs[1][: int(outputs[4][0])] >= np.float32(threshold)).sum()) - len(got)
        for g, w in zip(got, want, strict=True):
            assert (g["image_id"], g["category_id"], g["category_name"]) == (
                w["image_id"],
                w["category_id"],
                w["category_name"],
            )
            assert g["score"] == w["score"]
            assert g["bbox"] == w["bbox"]
            assert g["segmentation"]["size"] == list(orig_hw)
            if g["segmentation"] != w["segmentation"]:
                assert _iou(g["segmentation"], w["segmentation"]) >= 0.999
            identical += g["segmentation"] == w["segmentation"]
            detections += 1
    assert detections > 200
    assert outside > 0  # both dropped the boxes wholly in the padding alike
    assert identical / detections >= 0.99


def test_answer_encoding_round_trips(ops):
    results = [{"image_id": 0, "bbox": [1.5, 2.0, 3.0, 4.0], "score": 0.25, "category_id": 3}]
    encoded = ops.encode_detections(results)
    assert encoded == protocol.encode_detections(results)
    assert protocol.decode_detections(encoded) == json.loads(json.dumps(results))
    with pytest.raises(ValueError, match="JSON list"):
        protocol.decode_detections(b'{"not": "a list"}')


def test_label_map_must_be_complete(ops):
    assert ops.categories_from_label_map(LABELS.to_json()) == [
        (3, "square"),
        (7, "tri"),
        (9, "circle"),
    ]
    with pytest.raises(ValueError, match=r"1\.\.K"):
        ops.categories_from_label_map([{"id": 1, "name": "a", "label": 2}])


def test_the_engine_shares_the_ops_helpers_rather_than_copying_them() -> None:
    """The engine imports the numpy helpers from the ops module: one definition each."""
    from maskops.data import transforms
    from maskops.evaluation import images, postprocess
    from maskops.serving.triton_models import maskops_serving_ops as ops

    shared = {
        transforms: ("fit_scale", "resized_hw"),
        images: ("to_rgb", "IMAGE_FORMATS"),
        postprocess: ("runs_to_counts", "crop_to_counts", "compress_counts"),
    }
    for module, names in shared.items():
        for name in names:
            assert getattr(module, name) is getattr(ops, name), f"{module.__name__}.{name}"
