"""Pretrained weights by name or URL: fine-tuning from a torchvision weights name, fetching
a URL from a loopback server with its SHA-256 checked, the offline refusal, ``maskops weights
list|pull`` and the class heads re-initialised by name in the log.

Nothing reaches the internet: a name's file is placed in the cache under torchvision's
file name (as an operator without internet would; a cached file is trusted by name, as
torch.hub trusts it), and ``MASKOPS_OFFLINE=1`` guarantees no download is tried. The files
are small random weights in torchvision's layout, not the published ones.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from maskops.checkpoints.hub import fetch_weights, weights_source
from maskops.checkpoints.model_file import CheckpointError
from maskops.cli.main import main

if TYPE_CHECKING:
    from maskops.spec.models import ExperimentSpec, MaskRCNNConfig

RESNET18 = "ResNet18_Weights.IMAGENET1K_V1"
COCO = "MaskRCNN_ResNet50_FPN_Weights.COCO_V1"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty weights cache, offline: any download attempt fails the test."""
    folder = tmp_path / "weights"
    folder.mkdir()
    monkeypatch.setenv("MASKOPS_WEIGHTS_DIR", str(folder))
    monkeypatch.setenv("MASKOPS_OFFLINE", "1")
    return folder


def _imagenet_resnet18(path: Path) -> dict[str, torch.Tensor]:
    """A random torchvision ResNet-18 classifier saved at ``path`` (torchvision's layout:
    conv1, bn1, layer1..4, fc at the top level)."""
    from torchvision.models import resnet18

    torch.manual_seed(3)
    state = resnet18().state_dict()
    torch.save(state, path)
    return state


@pytest.mark.usefixtures("signal_handlers")
def test_fine_tune_from_a_weights_name(
    tmp_path: Path,
    cache: Path,
    tiny_spec: ExperimentSpec,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from maskops.spec import spec_to_text
    from maskops.training.train import build_training_model

    file_name = weights_source(RESNET18).file_name
    assert file_name == "resnet18-f37072fd.pth"  # torchvision's, hash prefix included
    state = _imagenet_resnet18(cache / file_name)
    config = tiny_spec.maskrcnn_config.model_copy(update={"nlayers": 18})
    spec = tiny_spec.model_copy(
        update={"checkpoint": RESNET18, "total_steps": 1, "maskrcnn_config": config}
    )
    (tmp_path / "spec.txt").write_text(spec_to_text(spec))

    model = build_training_model(spec, num_classes=4)
    body = model.state_dict()
    for key in ("conv1.weight", "layer4.1.conv2.weight", "layer2.0.downsample.0.weight"):
        assert torch.equal(body[f"backbone.body.{key}"], state[key]), key

    caplog.set_level(logging.INFO)
    argv = ["train", "-e", str(tmp_path / "spec.txt"), "-d", str(tmp_path / "run")]
    assert main(argv) == 0, capsys.readouterr().err
    assert "training finished at step 1/1" in capsys.readouterr().out
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint ")]
    assert loaded and loaded[0].startswith(f"checkpoint {RESNET18}: loaded "), loaded


def test_offline_names_the_file_to_place_and_where(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["weights", "pull", COCO]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "place maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth (from https://" in err
    assert f"in {cache}" in err and "MASKOPS_OFFLINE" in err


def test_weights_list_shows_the_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cache / "resnet50-11ad3fa6.pth").write_bytes(b"placed by the operator")
    assert main(["weights", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["ResNet50_Weights.IMAGENET1K_V2"].endswith("  cached")
    assert "not cached (170 MB)" in rows[COCO]
    assert rows["cache:"] == f"cache: {cache}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server on a folder: ``(base URL, folder)``."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_is_fetched_once_with_its_hash_checked(
    served: tuple[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, folder = served
    monkeypatch.delenv("MASKOPS_OFFLINE")
    torch.save({"conv1.weight": torch.ones(2, 3, 1, 1)}, folder / "tiny.pth")
    data = (folder / "tiny.pth").read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()

    wrong = f"{base}/tiny.pth#sha256={'0' * 64}"
    with pytest.raises(CheckpointError, match="invalid hash value"):
        fetch_weights(wrong)
    assert list(cache.iterdir()) == []  # nothing half-checked is left to trust

    path = fetch_weights(f"{base}/tiny.pth#sha256={sha256}", progress=False)
    assert path == cache / "tiny.pth" and path.read_bytes() == data
    (folder / "tiny.pth").unlink()  # the second time comes from the cache
    assert fetch_weights(f"{base}/tiny.pth#sha256={sha256}") == path
    path.write_bytes(b"changed")
    with pytest.raises(CheckpointError, match="remove it to fetch it again"):
        fetch_weights(f"{base}/tiny.pth#sha256={sha256}")


def test_class_heads_of_another_dataset_are_reinitialised_and_named(
    cache: Path, tiny_config: Callable[..., MaskRCNNConfig], caplog: pytest.LogCaptureFixture
) -> None:
    """A COCO Mask R-CNN (91 classes) into a 4-class model: everything else loads."""
    from maskops.checkpoints.pretrained import load_weights_into
    from maskops.modeling import build_model

    coco = build_model(tiny_config(), num_classes=91, image_size=(128, 128))
    torch.save(coco.state_dict(), cache / weights_source(COCO).file_name)
    model = build_model(tiny_config(), num_classes=4, image_size=(128, 128))
    with caplog.at_level(logging.WARNING):
        report = load_weights_into(model, COCO)
    heads = {
        "roi_heads.box_predictor.cls_score.weight",
        "roi_heads.box_predictor.bbox_pred.weight",
        "roi_heads.mask_predictor.mask_fcn_logits.weight",
    }
    assert heads <= {key for key, _, _ in report.shape_mismatch}
    assert len(report.loaded) > 100
    [message] = [r.getMessage() for r in caplog.records if "re-initialised" in r.getMessage()]
    assert message.startswith(f"checkpoint {COCO}: re-initialised (other shapes: 91 classes ")
    assert all(head in message for head in heads)


def test_a_url_without_its_hash_is_refused_in_the_spec() -> None:
    from maskops.spec import SpecError, parse_spec_text

    with pytest.raises(SpecError, match="sha256"):
        parse_spec_text('checkpoint: "https://example.org/w.pth"\n')
    spec = parse_spec_text(f'checkpoint: "{RESNET18}"\n').resolve_paths("/somewhere")
    assert spec.checkpoint == RESNET18
