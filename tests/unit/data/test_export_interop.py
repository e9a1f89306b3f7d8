"""The prediction exports, loaded by the labelling tools' own libraries.

Datumaro and label-studio-sdk refuse the lock's numpy, pillow and pyjwt (the reasons head
``tests/interop/requirements.txt``), so they run in a virtualenv of their own,
``.venv-interop`` (git-ignored), installed from
``tests/interop/requirements.txt`` (exact pins: the lock of this check only) and kept
while that file is unchanged. ``tests/interop/read_exports.py`` reports there what the
libraries read; here it is compared with the masks exported: Datumaro's CVAT importer
gets every polygon with its label and score, label-studio-sdk validates every prediction
against the exported labelling config, and its brush decoder gives back every mask.

Under ``./dev test`` or in CI (``MASKOPS_REQUIRE_SERVICES=1`` or ``CI=true``) a failed
install fails the test; elsewhere (no access to the package index, say) it skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pycocotools import mask as mask_utils

from maskops.data.demo import DemoDataset
from maskops.data.formats.predictions import export_predictions

REPO = Path(__file__).resolve().parents[3]
REQUIREMENTS = REPO / "tests" / "interop" / "requirements.txt"
SCRIPT = REPO / "tests" / "interop" / "read_exports.py"
VENV = REPO / ".venv-interop"
MIN_IOU = 0.95
INSTALL_TIMEOUT_S = 600


def _required() -> bool:
    return os.environ.get("MASKOPS_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"


def interop_python() -> Path:
    """The interop virtualenv's python, installed once per version of the requirements and
    of the Python that makes it."""
    made_by = f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + made_by.encode()).hexdigest()[:16]
    stamp, python = VENV / f".installed-{digest}", VENV / "bin" / "python"
    if stamp.exists():
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    try:
        done = subprocess.run(
            [*pip, "-r", str(REQUIREMENTS)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            # pip would count what a PYTHONPATH holds as installed and leave it out.
            env=_without_pythonpath(),
        )
        failure = None if done.returncode == 0 else done.stderr[-3000:]
    except subprocess.TimeoutExpired:
        failure = f"no end after {INSTALL_TIMEOUT_S} s"
    if failure is not None:
        shutil.rmtree(VENV, ignore_errors=True)
        message = f"installing {REQUIREMENTS.relative_to(REPO)} failed: {failure}"
        if _required():
            pytest.fail(message)
        pytest.skip(message)
    stamp.touch()
    return python


def _without_pythonpath() -> dict[str, str]:
    """This process's environment without PYTHONPATH: the interop virtualenv holds all it
    imports, and a PYTHONPATH of this process (another Python's wheels, in the GPU-host
    rehearsal) must reach neither its install nor its runs."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _mask(rle: dict[str, Any]) -> dict[str, Any]:
    return {"size": rle["size"], "counts": rle["counts"].encode()}


def _polygon_iou(polygons: list[list[float]], rle: dict[str, Any]) -> float:
    height, width = rle["size"]
    drawn = mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))
    return float(mask_utils.iou([_mask(rle)], [drawn], [0])[0][0])


Detection = tuple[str, float, dict[str, Any]]
"""(label, score, COCO RLE mask) of one exported detection."""
Object = tuple[str, float | None, list[list[float]]]
"""(label, score or None where the format has none, polygons in pixels) as a tool reads it."""


def _detections(label_dir: Path) -> dict[str, list[Detection]]:
    """Image file stem -> the inference label folder's detections."""
    index = json.loads((label_dir / "coco_images.json").read_text())
    names = {c["id"]: c["name"] for c in index["categories"]}
    stems = {im["id"]: Path(im["file_name"]).stem for im in index["images"]}
    out: dict[str, list[Detection]] = {stem: [] for stem in stems.values()}
    for path in sorted(label_dir.glob("0*.json")):
        for d in json.loads(path.read_text()):
            detection = (names[d["category_id"]], d["score"], d["segmentation"])
            out[stems[d["image_id"]]].append(detection)
    return out


def test_the_tools_libraries_load_the_exports(
    label_dir: Path, demo_dataset: DemoDataset, tmp_path: Path
) -> None:
    out = tmp_path / "exports"
    formats = ["cvat", "labelstudio", "labelstudio-brush"]
    export_predictions(label_dir, out, formats, model_version="v7")
    # Datumaro reads a CVAT dataset: the XML with the images under images/ beside it.
    shutil.copytree(demo_dataset.val_images, out / "images")
    python = interop_python()
    done = subprocess.run(
        [str(python), str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_without_pythonpath(),
    )
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(done.stdout)
    assert report["versions"]["numpy"].startswith("2.")
    detections = _detections(label_dir)
    index = json.loads((label_dir / "coco_images.json").read_text())

    # Datumaro's CVAT importer: every image, the labels in order, polygons only, each
    # detection's outline (parts grouped by group_id) with its label and score.
    cvat = report["cvat"]
    assert cvat["labels"] == [c["name"] for c in index["categories"]]
    assert cvat["items"].keys() == detections.keys()
    for stem, shapes in cvat["items"].items():
        assert {s["type"] for s in shapes} <= {"polygon"}
        _match(stem, _objects(shapes, scored=True), detections[stem])

    # label-studio-sdk: the configs and every prediction valid; polygons as in CVAT.
    for name in ("labelstudio", "labelstudio-brush"):
        assert report[name]["config_error"] is None
        assert [t["errors"] for t in report[name]["tasks"]] == [[]] * len(detections)
    for task in report["labelstudio"]["tasks"]:
        stem = Path(task["image"].rsplit("?d=", 1)[1]).stem
        _match(stem, _objects(task["regions"], scored=False), detections[stem])
    # ... and its brush decoder gives every mask back, pixel for pixel.
    for task in report["labelstudio-brush"]["tasks"]:
        stem = Path(task["image"].rsplit("?d=", 1)[1]).stem
        got = sorted((r["label"], r["counts"]) for r in task["regions"])
        assert got == sorted((label, rle["counts"]) for label, _, rle in detections[stem])


def _objects(shapes: list[dict[str, Any]], *, scored: bool) -> list[Object]:
    """Shapes grouped into objects (same label and group)."""
    objects: dict[Any, Object] = {}
    for shape in shapes:
        key = (shape["label"], shape["group"])
        score = shape["score"] if scored else None
        objects.setdefault(key, (shape["label"], score, []))[2].append(shape["points"])
    return list(objects.values())


def _match(
    stem: str,
    objects: list[Object],
    detections: list[Detection],
) -> None:
    """One object per detection, with its label (and score), covering its mask."""
    assert len(objects) == len(detections), stem
    left = list(objects)
    for label, score, rle in detections:
        found = next(
            (
                o
                for o in left
                if o[0] == label and o[1] in (None, score) and _polygon_iou(o[2], rle) >= MIN_IOU
            ),
            None,
        )
        assert found is not None, (stem, label, score)
        left.remove(found)
