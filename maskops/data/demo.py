"""A synthetic instance-segmentation dataset in COCO format with exact masks.

Images show flat-coloured circles, squares and triangles on textured gradient backgrounds,
each shape in any colour, or with ``ShapeLayout.hue_by_class`` in its class's band of hues.
Shapes may overlap: a shape drawn later occludes earlier ones, and an occluded shape's
``segmentation`` is its *visible* part, written as several convex polygons (polygon minus
each occluder, cut along the occluder's edges). Every image pixel a shape's colour covers
is exactly the pycocotools decoding of that shape's polygons: the image is painted from
those decodings, and placements whose decodings would claim a pixel twice are rejected.

Category ids are deliberately not contiguous (circle 1, square 3, triangle 7) so that the
id -> training-label mapping is exercised by every run on demo data.

Determinism: each image is drawn from its own generator seeded by ``(seed, image index)``,
so a dataset is a pure function of its arguments and two sizes share their first images.
"""

from __future__ import annotations

import colorsys
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from maskops.data.ordered_pool import OrderedPool, worker_count

CATEGORIES: tuple[dict[str, Any], ...] = (
    {"id": 1, "name": "circle", "supercategory": "shape"},
    {"id": 3, "name": "square", "supercategory": "shape"},
    {"id": 7, "name": "triangle", "supercategory": "shape"},
)

_MIN_VISIBLE_FRACTION = 0.55
_PLACEMENT_TRIES = 30
_JPEG_QUALITY = 95

Polygon = list[tuple[float, float]]
"""Vertices in pixel coordinates (x, y), counter-clockwise in image axes (y down)."""


@dataclass(frozen=True)
class DemoDataset:
    """Where :func:`generate_demo_dataset` wrote a dataset."""

    root: Path
    train_images: Path
    val_images: Path
    train_json: Path
    val_json: Path
    num_train: int
    num_val: int

    def __fspath__(self) -> str:
        return str(self.root)

    def __truediv__(self, other: str) -> Path:
        """``dataset / "annotations" / "val.json"``: the dataset acts as its root path."""
        return self.root / other


@dataclass(frozen=True)
class ShapeLayout:
    """How many shapes an image holds and how large they are.

    The default is the varied dataset the tests use; the demo walk uses fewer, larger
    shapes (:data:`DEMO_WALK_LAYOUT`) so that a few minutes of CPU training learn them.
    """

    max_shapes: int = 5
    """Each image holds min_shapes..max_shapes shapes (fewer when placements keep failing)."""
    min_radius: float = 0.09
    max_radius: float = 0.22
    """Circumradius range, as a fraction of the image's shorter side."""
    min_shapes: int = 1
    hue_by_class: bool = False
    """Each class drawn in its own band of hues (circles red, squares green, triangles
    blue) instead of any colour: the classes then differ in colour as well as outline."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_shapes <= self.max_shapes:
            raise ValueError(
                f"need 1 <= min_shapes <= max_shapes, got {self.min_shapes}, {self.max_shapes}"
            )
        if not 0.0 < self.min_radius <= self.max_radius <= 0.45:
            raise ValueError(
                f"need 0 < min_radius <= max_radius <= 0.45, got "
                f"{self.min_radius}, {self.max_radius}"
            )


DEMO_WALK_LAYOUT = ShapeLayout(max_shapes=3, min_radius=0.14, max_radius=0.26, hue_by_class=True)
"""A resnet10 trained from scratch for four minutes tells 128 px outlines apart only
roughly; with each class in its own hues it finds every shape once, with its class."""

_CLASS_HUES = {"circle": 0.0, "square": 1 / 3, "triangle": 2 / 3}
"""The centre of each class's hue band (HSV hue in [0, 1)) under ``hue_by_class``."""
_HUE_HALF_WIDTH = 1 / 18
"""Each band spans 20 degrees either side of its centre: the bands never meet."""
_MIN_CONTRAST = 150
"""Least sum of absolute RGB differences between a shape and the background under it."""
_COLOUR_TRIES = 50
"""Draws of a colour before the most contrasting one is taken."""


@dataclass
class _Shape:
    category_id: int
    polygon: Polygon
    color: tuple[int, int, int]


def generate_demo_dataset(
    out_dir: Path | str,
    *,
    num_images: int = 200,
    image_size: tuple[int, int] = (256, 256),
    seed: int = 0,
    val_fraction: float = 0.2,
    layout: ShapeLayout = ShapeLayout(),
    workers: int = 1,
) -> DemoDataset:
    """Write ``out_dir/images/{train,val}/*.jpg`` and ``out_dir/annotations/{train,val}.json``.

    Args:
        out_dir: destination directory (created; existing files of the same names are
            overwritten).
        num_images: total number of images over both splits (>= 2).
        image_size: ``(height, width)`` of every image, each side >= 32.
        seed: any integer; the same arguments always give the same files.
        val_fraction: share of images in the validation split (at least one image each).
        layout: how many shapes per image and how large.
        workers: processes drawing images (each image has its own random stream, so the
            files are the same for any count; a 30-shape 480x640 image takes about a
            second on one core).

    Image ids run 1..num_images over both splits (train first); annotation ids likewise.
    Each file's ``file_name`` is relative to its split's image directory.
    """
    height, width = image_size
    if num_images < 2:
        raise ValueError(f"num_images must be >= 2 (one per split), got {num_images}")
    if height < 32 or width < 32:
        raise ValueError(f"image_size sides must be >= 32, got {image_size}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    num_val = min(num_images - 1, max(1, round(num_images * val_fraction)))
    num_train = num_images - num_val
    root = Path(out_dir)
    paths = {split: root / "images" / split for split in ("train", "val")}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)

    splits = [("train", 0, num_train), ("val", num_train, num_val)]
    jobs = [
        _ImageJob(seed, index, paths[split] / f"{index + 1:06d}.jpg", image_size, layout)
        for split, first, count in splits
        for index in range(first, first + count)
    ]
    with OrderedPool(worker_count(workers)) as pool:
        drawn = list(pool.map(_draw_and_save, jobs))
    next_ann_id = 1
    for split, first, count in splits:
        images: list[dict[str, Any]] = []
        annotations: list[dict[str, Any]] = []
        for index in range(first, first + count):
            image_id = index + 1
            file_name = f"{image_id:06d}.jpg"
            images.append(
                {"id": image_id, "file_name": file_name, "height": height, "width": width}
            )
            for ann in drawn[index]:
                annotations.append({"id": next_ann_id, "image_id": image_id, **ann})
                next_ann_id += 1
        document = {
            "info": {"description": f"maskops synthetic shapes, seed {seed}"},
            "licenses": [],
            "images": images,
            "annotations": annotations,
            "categories": [dict(c) for c in CATEGORIES],
        }
        (root / "annotations" / f"{split}.json").write_text(json.dumps(document))
    return DemoDataset(
        root=root,
        train_images=paths["train"],
        val_images=paths["val"],
        train_json=root / "annotations" / "train.json",
        val_json=root / "annotations" / "val.json",
        num_train=num_train,
        num_val=num_val,
    )


@dataclass(frozen=True)
class _ImageJob:
    """One image of :func:`generate_demo_dataset`: its stream ``[seed, index]`` and file."""

    seed: int
    index: int
    path: Path
    image_size: tuple[int, int]
    layout: ShapeLayout


def _draw_and_save(job: _ImageJob) -> list[dict[str, Any]]:
    """Draw ``job``'s image, write its JPEG; its annotations (without ids)."""
    height, width = job.image_size
    rng = np.random.default_rng([job.seed, job.index])
    drawn = draw_image(rng, height, width, layout=job.layout)
    Image.fromarray(drawn.pixels).save(job.path, format="JPEG", quality=_JPEG_QUALITY)
    return drawn.annotations


@dataclass(frozen=True)
class DrawnImage:
    pixels: np.ndarray
    """uint8 [H, W, 3]."""
    annotations: list[dict[str, Any]]
    """COCO annotations without ``id`` and ``image_id``, in drawing order."""
    colors: list[tuple[int, int, int]]
    """Each annotation's flat colour (before noise)."""


def draw_image(
    rng: np.random.Generator,
    height: int,
    width: int,
    *,
    noise: float = 4.0,
    layout: ShapeLayout = ShapeLayout(),
) -> DrawnImage:
    """One image and its annotations; ``noise`` is the sigma of the per-pixel noise."""
    background = _background(rng, height, width)
    placed = _Layout([], [], [], [], [])
    for _ in range(int(rng.integers(layout.min_shapes, layout.max_shapes + 1))):
        for _try in range(_PLACEMENT_TRIES):
            candidate = _random_shape(rng, height, width, background, layout)
            grown = _placed_over(placed, candidate, height, width)
            if grown is not None:
                placed = grown
                break
    pixels = background
    annotations: list[dict[str, Any]] = []
    for shape, mask in zip(placed.shapes, placed.masks, strict=True):
        pixels[mask.astype(bool)] = shape.color
    shapes = placed.shapes
    for shape, pieces in zip(shapes, placed.kept, strict=True):
        rle = _rasterise(pieces, height, width)
        x, y, w, h = (float(v) for v in mask_utils.toBbox(rle))
        annotations.append(
            {
                "category_id": shape.category_id,
                "segmentation": [_flat(p) for p in pieces],
                "area": float(mask_utils.area(rle)),
                "bbox": [x, y, w, h],
                "iscrowd": 0,
            }
        )
    if noise > 0:
        # A tile of noise repeated over the image: as good as fresh noise for a detector,
        # and ~50x cheaper at 640x480 than drawing a normal variate per pixel.
        tile = rng.standard_normal(size=(61, 67, 3), dtype=np.float32) * np.float32(noise)
        reps = (-(-height // 61), -(-width // 67), 1)
        pixels += np.tile(tile, reps)[:height, :width]
    return DrawnImage(
        np.clip(pixels, 0, 255).astype(np.uint8), annotations, [s.color for s in shapes]
    )


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A float32 [H, W, 3] two-colour linear gradient with low-frequency texture."""
    start, end = rng.uniform(30, 225, size=(2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    diagonal = math.hypot(height, width)
    xs = np.arange(width, dtype=np.float32) * np.float32(math.cos(angle) / diagonal)
    ys = np.arange(height, dtype=np.float32) * np.float32(math.sin(angle) / diagonal)
    t = np.clip(ys[:, None] + xs[None, :] + np.float32(0.5), 0, 1)
    image = start.astype(np.float32) + (end - start).astype(np.float32) * t[..., None]
    coarse = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    texture = (np.asarray(smooth, dtype=np.float32) - np.float32(127.5)) * np.float32(0.2)
    return np.asarray(image + texture, dtype=np.float32)


def _random_shape(
    rng: np.random.Generator,
    height: int,
    width: int,
    background: np.ndarray,
    layout: ShapeLayout,
) -> _Shape:
    category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    radius = rng.uniform(layout.min_radius, layout.max_radius) * min(height, width)
    cx = rng.uniform(radius + 1, width - radius - 1)
    cy = rng.uniform(radius + 1, height - radius - 1)
    rotation = rng.uniform(0, 2 * math.pi)
    vertices = {"circle": 40, "square": 4, "triangle": 3}[category["name"]]
    polygon = [
        (
            cx + radius * math.cos(rotation + 2 * math.pi * k / vertices),
            cy + radius * math.sin(rotation + 2 * math.pi * k / vertices),
        )
        for k in range(vertices)
    ]
    local = background[int(cy), int(cx)]
    if layout.hue_by_class:
        color = _class_colour(rng, category["name"], local)
    else:
        color = rng.uniform(0, 255, size=3)
        # A colour too close to the background under the shape would make it unlearnable.
        while float(np.abs(color - local).sum()) < _MIN_CONTRAST:
            color = rng.uniform(0, 255, size=3)
    rounded = [(round(x, 2), round(y, 2)) for x, y in polygon]
    return _Shape(int(category["id"]), rounded, (int(color[0]), int(color[1]), int(color[2])))


def _class_colour(rng: np.random.Generator, name: str, local: np.ndarray) -> np.ndarray:
    """An RGB colour (float [3], 0..255) in ``name``'s hue band that stands out from
    ``local``, the background under the shape: the most contrasting of a few draws when
    none reaches ``_MIN_CONTRAST`` (a background of the same hue and brightness)."""
    best, best_contrast = np.zeros(3), -1.0
    for _ in range(_COLOUR_TRIES):
        hue = (_CLASS_HUES[name] + rng.uniform(-_HUE_HALF_WIDTH, _HUE_HALF_WIDTH)) % 1.0
        rgb = colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.45, 1.0))
        color = np.array(rgb) * 255.0
        contrast = float(np.abs(color - local).sum())
        if contrast >= _MIN_CONTRAST:
            return color
        if contrast > best_contrast:
            best, best_contrast = color, contrast
    return best


@dataclass(frozen=True)
class _Layout:
    """Shapes placed so far, in drawing order, and for each: its visible pieces (convex,
    unrounded: the shape less every later one), those pieces as annotated, its visible
    mask and its full area."""

    shapes: list[_Shape]
    pieces: list[list[Polygon]]
    kept: list[list[Polygon]]
    masks: list[np.ndarray]
    full_areas: list[int]


def _placed_over(layout: _Layout, candidate: _Shape, height: int, width: int) -> _Layout | None:
    """``layout`` with ``candidate`` drawn over it, or None if that is not acceptable.

    Rejected: a shape less than ``_MIN_VISIBLE_FRACTION`` visible, or two decodings that
    claim the same pixel (the image could then not show both exactly). Each shape's pieces
    are its pieces under the earlier layout less the candidate: the same clips, in the
    same order, as clipping it by every later shape afresh, made once each rather than
    again at every placement (30 shapes at 480x640 took 3 s an image that way); a shape
    the candidate leaves whole keeps its mask.
    """
    occluder = _Occluder.of(candidate.polygon)
    pieces = [[part for piece in raw for part in occluder.cut(piece)] for raw in layout.pieces]
    pieces.append([candidate.polygon])
    candidate_area = int(mask_utils.area(_rasterise([candidate.polygon], height, width)))
    full_areas = [*layout.full_areas, candidate_area]
    kept_all: list[list[Polygon]] = []
    masks: list[np.ndarray] = []
    claimed = np.zeros((height, width), dtype=np.uint8)
    for index, raw in enumerate(pieces):
        whole = index < len(layout.pieces) and _same_pieces(raw, layout.pieces[index])
        kept = layout.kept[index] if whole else _kept(raw)
        if not kept:
            return None
        mask = layout.masks[index] if whole else mask_utils.decode(_rasterise(kept, height, width))
        full = full_areas[index]
        if full == 0 or mask.sum() < _MIN_VISIBLE_FRACTION * full or (claimed & mask).any():
            return None
        claimed |= mask
        kept_all.append(kept)
        masks.append(mask)
    return _Layout([*layout.shapes, candidate], pieces, kept_all, masks, full_areas)


def _same_pieces(pieces: list[Polygon], before: list[Polygon]) -> bool:
    """Whether the cut returned every piece of ``before`` itself (none was touched)."""
    return len(pieces) == len(before) and all(a is b for a, b in zip(pieces, before, strict=True))


def _kept(pieces: Sequence[Polygon]) -> list[Polygon]:
    """Visible pieces as annotated: coordinates to 2 decimals, slivers under 1 px^2 dropped."""
    return [[(round(x, 2), round(y, 2)) for x, y in p] for p in pieces if _area(p) >= 1.0]


@dataclass(frozen=True)
class _Occluder:
    """A convex polygon that cuts others (:meth:`cut`), counter-clockwise, with its edges'
    starts and directions as arrays."""

    polygon: Polygon
    starts: np.ndarray
    """[E, 2] float64: each edge's first corner."""
    directions: np.ndarray
    """[E, 2] float64: each edge's end less its start."""

    @classmethod
    def of(cls, polygon: Polygon) -> _Occluder:
        oriented = polygon[::-1] if _signed_area(polygon) < 0 else polygon
        starts = np.asarray(oriented, dtype=np.float64)
        return cls(oriented, starts, np.roll(starts, -1, axis=0) - starts)

    def cut(self, subject: Polygon) -> list[Polygon]:
        """``subject`` (convex) less this polygon, as disjoint convex polygons: piece i
        lies outside edge i and inside edges 0..i-1, so the pieces tile the difference
        without overlapping. A subject left whole comes back as itself."""
        first, answer = self._first_edge_that_cuts(subject)
        return answer if answer is not None else self.clip_from(subject, first)

    def clip_from(self, subject: Polygon, first: int) -> list[Polygon]:
        """The pieces of :meth:`cut`, clipping ``subject`` at each edge from ``first`` on
        (Sutherland-Hodgman against each edge's line, keeping what lies outside it)."""
        clip = self.polygon
        pieces: list[Polygon] = []
        remaining = subject
        for i in range(first, len(clip)):
            start, end = clip[i], clip[(i + 1) % len(clip)]
            outside = _clip_halfplane(remaining, start, end, keep_left=False)
            if len(outside) >= 3 and _area(outside) > 1e-6:
                pieces.append(outside)
            remaining = _clip_halfplane(remaining, start, end, keep_left=True)
            if len(remaining) < 3:
                break
        return pieces

    def _first_edge_that_cuts(self, subject: Polygon) -> tuple[int, list[Polygon] | None]:
        """Where the clipping of :meth:`cut` first changes ``subject``, from the side of
        each edge that each vertex lies on (the products :func:`_clip_halfplane` forms, in
        the same float64 operations, for every edge at once).

        Edges with every vertex strictly inside keep ``subject`` whole and add no piece,
        so the clipping may start at the first other edge: its index, and None. Where that
        edge has every vertex strictly outside, the difference is ``subject`` itself (a
        shape clear of this one), and where no edge is left, nothing (a shape under it):
        the index, and that answer.
        """
        points = np.asarray(subject, dtype=np.float64)
        starts, (dx, dy) = self.starts, self.directions.T
        sides = dx[:, None] * (points[None, :, 1] - starts[:, 1, None]) - dy[:, None] * (
            points[None, :, 0] - starts[:, 0, None]
        )
        inside = (sides > 0).all(axis=1)
        if inside.all():
            return len(self.polygon), []
        first = int(inside.argmin())
        if (sides[first] < 0).all():
            return first, [subject] if _area(subject) > 1e-6 else []
        return first, None


def _clip_halfplane(
    polygon: Polygon, start: tuple[float, float], end: tuple[float, float], *, keep_left: bool
) -> Polygon:
    """Sutherland-Hodgman clip of a convex polygon against the line start->end."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    sign = 1.0 if keep_left else -1.0

    def side(p: tuple[float, float]) -> float:
        return sign * (dx * (p[1] - start[1]) - dy * (p[0] - start[0]))

    out: Polygon = []
    for k, current in enumerate(polygon):
        previous = polygon[k - 1]
        s_cur, s_prev = side(current), side(previous)
        if s_cur >= 0:
            if s_prev < 0:
                out.append(_intersect(previous, current, s_prev, s_cur))
            out.append(current)
        elif s_prev >= 0:
            out.append(_intersect(previous, current, s_prev, s_cur))
    return out


def _intersect(
    a: tuple[float, float], b: tuple[float, float], sa: float, sb: float
) -> tuple[float, float]:
    t = sa / (sa - sb)
    return (a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))


def _signed_area(polygon: Polygon) -> float:
    return 0.5 * sum(
        x0 * y1 - x1 * y0
        for (x0, y0), (x1, y1) in zip(polygon, polygon[1:] + polygon[:1], strict=True)
    )


def _area(polygon: Polygon) -> float:
    return abs(_signed_area(polygon))


def _flat(polygon: Polygon) -> list[float]:
    return [c for point in polygon for c in point]


def _rasterise(polygons: Sequence[Polygon], height: int, width: int) -> dict[str, Any]:
    """pycocotools' rasterisation of a multi-polygon as one compressed RLE."""
    rles = mask_utils.frPyObjects([_flat(p) for p in polygons], height, width)
    merged: dict[str, Any] = mask_utils.merge(rles)
    return merged
