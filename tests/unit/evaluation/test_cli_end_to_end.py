"""``maskops evaluate`` and ``maskops inference`` on the demo data with a real model."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
import pytest
from PIL import Image
from pycocotools.coco import COCO

from maskops.cli.main import main
from maskops.evaluation import metric_names
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec


def _spec_file(directory: Path, spec: ExperimentSpec) -> Path:
    """The spec as a TAO text file whose data paths are relative to the file."""
    directory.mkdir(parents=True, exist_ok=True)
    data = spec.data_config
    relative = {
        "validation_file_pattern": os.path.relpath(data.validation_file_pattern, directory),
        "training_file_pattern": os.path.relpath(data.training_file_pattern, directory),
        "val_json_file": os.path.relpath(data.val_json_file, directory),
    }
    spec = spec.model_copy(update={"data_config": data.model_copy(update=relative)})
    path = directory / "spec.txt"
    path.write_text(spec_to_text(spec))
    return path


def test_evaluate_prints_and_writes_the_24_metrics(
    tmp_path: Path,
    tiny_spec: ExperimentSpec,
    model_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec_path = _spec_file(tmp_path / "specs", tiny_spec)
    out, log = tmp_path / "metrics.json", tmp_path / "logs" / "eval.log"
    code = main(
        [
            "evaluate",
            "-e",
            str(spec_path),
            "-m",
            str(model_file),
            "-o",
            str(out),
            "--log_file",
            str(log),
            "-k",
            "tlt_encode",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["metrics"]) == metric_names(["bbox", "segm"])
    assert all(-1.0 <= v <= 1.0 for v in report["metrics"].values())
    assert report["num_images"] == 4  # eval_samples of the 8 val images
    stdout = capsys.readouterr().out
    assert "mask_ARl" in stdout and "mask_ARl" in log.read_text()


def test_evaluate_bad_input_is_one_line(
    tmp_path: Path,
    tiny_spec: ExperimentSpec,
    untrained_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec_path = _spec_file(tmp_path, tiny_spec)
    assert main(["evaluate", "-e", str(spec_path), "-m", str(tmp_path / "none.pth")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "none.pth" in err

    no_gt = tiny_spec.model_copy(
        update={"data_config": tiny_spec.data_config.model_copy(update={"val_json_file": ""})}
    )
    spec_path = tmp_path / "no_gt.txt"
    spec_path.write_text(spec_to_text(no_gt))
    assert main(["evaluate", "-e", str(spec_path), "-m", str(untrained_checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "val_json_file" in err

    no_shards = tiny_spec.model_copy(
        update={
            "data_config": tiny_spec.data_config.model_copy(
                update={"validation_file_pattern": str(tmp_path / "nowhere" / "val*")}
            )
        }
    )
    (tmp_path / "no_shards.txt").write_text(spec_to_text(no_shards))
    code = main(
        ["evaluate", "-e", str(tmp_path / "no_shards.txt"), "-m", str(untrained_checkpoint)]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "validation_file_pattern: no shards match" in err

    args = ["-e", str(spec_path), "-m", str(untrained_checkpoint), "-o", str(tmp_path / "o")]
    assert main(["inference", "-i", str(tmp_path / "no_images"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no_images: not a directory" in err
    not_a_model = tmp_path / "model.pth"
    not_a_model.write_text("hello")
    (tmp_path / "images").mkdir()
    args[3] = str(not_a_model)
    assert main(["inference", "-i", str(tmp_path / "images"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.pth" in err


def _rotated_png(path: Path) -> tuple[int, int]:
    """An RGBA PNG stored 96 wide x 64 high with EXIF orientation 8 (upright: 64 x 96)."""
    exif = Image.Exif()
    exif[0x0112] = 8
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 4), np.uint8))
    image.save(path, exif=exif.tobytes())
    return 96, 64  # upright (height, width)


def test_inference_writes_images_and_coco_json(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    demo_dataset: Any,
    tiny_spec: ExperimentSpec,
    model_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    images = tmp_path / "in"
    images.mkdir()
    for source in sorted(Path(demo_dataset.val_images).iterdir())[:2]:
        shutil.copy(source, images / source.name)
    upright = _rotated_png(images / "phone.PNG")
    (images / "corrupt.jpg").write_bytes(b"\xff\xd8 truncated")
    (images / "readme.txt").write_text("not an image")
    spec_path = _spec_file(tmp_path / "spec", tiny_spec)
    out_images, labels = tmp_path / "out", tmp_path / "labels"

    code = main(
        [
            "inference",
            "-i",
            str(images),
            "-o",
            str(out_images),
            "-e",
            str(spec_path),
            "-m",
            str(model_file),
            "-l",
            str(labels),
            "-t",
            "0.0",
            "--include_mask",
        ]
    )

    assert code == 0
    err = capsys.readouterr().err
    assert "corrupt.jpg: unreadable image" in err and "readme.txt" in err
    # Off a terminal the progress is whole lines; the unreadable file is counted too.
    assert re.search(r"^inference: 4/4 img \(100%\), [\d.]+ img/s", err, re.M), err
    assert "\r" not in err
    written = sorted(p.name for p in out_images.iterdir())
    expected = sorted(p.name for p in images.iterdir() if p.suffix.lower() in (".jpg", ".png"))
    assert written == [n for n in expected if n != "corrupt.jpg"]
    with Image.open(out_images / "phone.PNG") as annotated:
        assert (annotated.height, annotated.width) == upright
    coco = COCO(str(labels / "coco_images.json"))
    label_files = sorted(f.name for f in labels.glob("*.json") if f.name != "coco_images.json")
    assert label_files == sorted(f"{Path(n).stem}.json" for n in written)
    results = [r for f in label_files for r in json.loads((labels / f).read_text())]
    if request.node.callspec.params["model_file"] == "untrained":
        # Random weights score every class near 1/K: plenty of detections at threshold 0.
        # (Four training steps teach "background" first: the trained model may find none.)
        assert results
    if not results:
        return
    loaded = coco.loadRes(results)  # the results load as COCO results
    for ann in loaded.dataset["annotations"]:
        image = coco.imgs[ann["image_id"]]
        assert ann["segmentation"]["size"] == [image["height"], image["width"]]
        assert ann["category_id"] in {1, 3, 7}
        mask = mask_util.decode(
            {**ann["segmentation"], "counts": ann["segmentation"]["counts"].encode()}
        )
        assert mask.shape == (image["height"], image["width"])


def test_model_without_masks_reports_box_metrics_only(
    tmp_path: Path, tiny_spec: ExperimentSpec, demo_shards: Path
) -> None:
    from maskops.checkpoints.model_file import save_checkpoint
    from maskops.data.manifest import load_label_map
    from maskops.evaluation import run_evaluation
    from maskops.modeling import build_model

    config = tiny_spec.maskrcnn_config.model_copy(update={"include_mask": False})
    spec = tiny_spec.model_copy(update={"maskrcnn_config": config})
    label_map = load_label_map(f"{demo_shards}/val*")
    model = build_model(config, num_classes=label_map.num_classes, image_size=(128, 128))
    path = save_checkpoint(
        tmp_path / "boxes.pth", model=model, spec=spec, label_map=label_map, step=0
    )
    lines: list[str] = []
    metrics = run_evaluation(
        spec, path, out_json=tmp_path / "m.json", progress=False, log=lines.append
    )
    assert list(metrics) == metric_names(["bbox"])
    assert json.loads((tmp_path / "m.json").read_text())["metrics"] == metrics
    assert any(line.startswith("ARl") for line in "\n".join(lines).splitlines())
