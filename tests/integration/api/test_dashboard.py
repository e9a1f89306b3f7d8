"""The ``/ui`` dashboard in a real browser against the real API (tokens required).

``uvicorn maskops_api.main:app`` on the test Postgres, headless Chromium that can reach
nothing but 127.0.0.1 (see test_docs_ui.py), and for the job page a real ``celery worker``
training on the demo data. Without a token the pages show a token form and no data; with
one, a running job's loss curve grows on the page, and the "try an image" form draws the
masks and boxes of a COCO result: a fixed one made with pycocotools (checked pixel by
pixel), and the answer of a model trained, exported and published through a real Triton.

Screenshots for docs/dashboard.md are written when ``MASKOPS_DASHBOARD_SCREENSHOTS`` names
a folder (``docs/images``).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from maskops.export.options import DEFAULTS, export_file_name
from maskops_api.services.tokens import create_token
from maskops_core.db.models import Job, PublishedModel, TokenScope
from maskops_core.db.session import make_engine, make_session_factory
from maskops_core.settings import Settings
from tests.integration.api.conftest import ApiProcess, Worker, wait_for
from tests.integration.api.test_docs_ui import _wait, browser  # noqa: F401
from tests.integration.api.test_workflow import (  # noqa: F401
    Stack,
    create_experiment,
    register_demo,
    stack,
)

pytestmark = pytest.mark.integration

SCREENSHOTS = os.environ.get("MASKOPS_DASHBOARD_SCREENSHOTS", "")


@pytest.fixture
def server(clean_db: Settings, tmp_path: Path) -> Iterator[str]:
    """The API (the full environment) on a free loopback port, auth required; its URL."""
    api = ApiProcess(Path(sys.executable), clean_db, tmp_path, {"MASKOPS_AUTH": "required"})
    try:
        client = api.start()
        yield str(client.base_url).rstrip("/")
        client.close()
    finally:
        api.stop()


@pytest.fixture
def token(clean_db: Settings) -> str:
    engine = make_engine(clean_db)
    with make_session_factory(engine)() as session:
        _, secret = create_token(session, name="dashboard", scope=TokenScope.write)
    engine.dispose()
    return secret


def _api(server: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=server, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _open(driver: Any, url: str, token: str | None) -> None:
    """Open ``url`` with ``token`` in the tab's sessionStorage (none: without a token)."""
    driver.get(url)
    if token is None:
        driver.execute_script("sessionStorage.clear()")
    else:
        driver.execute_script("sessionStorage.setItem('maskops.token', arguments[0])", token)
    driver.refresh()


def _js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def _shown(driver: Any, element_id: str) -> bool:
    return bool(_js(driver, f"return !document.getElementById('{element_id}').hidden"))


def _no_csp_violations(driver: Any) -> None:
    console = [str(entry.get("message", "")) for entry in driver.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m], console


def _screenshot(driver: Any, name: str, height: int) -> None:
    if not SCREENSHOTS:
        return
    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1280, height)
    time.sleep(1)
    driver.save_screenshot(str(folder / name))
    driver.set_window_size(1280, 1000)


def test_without_a_token_the_pages_show_no_data(
    server: str,
    token: str,
    browser: Any,  # noqa: F811
    demo_root: str,
) -> None:
    with _api(server, token) as api:
        dataset = api.post(
            "/datasets",
            json={
                "name": "secret-demo",
                "train": {
                    "image_dir": f"{demo_root}/images/train",
                    "annotation_file": f"{demo_root}/annotations/train.json",
                },
            },
        )
        assert dataset.status_code == 201, dataset.text  # its convert job stays queued
        job_id = dataset.json()["convert_job_id"]
    assert httpx.get(f"{server}/jobs", timeout=10).status_code == 401

    pages = {
        "/ui": "jobs",
        f"/ui/jobs/{job_id}": "job-fields",
        "/ui/datasets": "datasets",
        "/ui/models": "models",
    }
    for path in pages:
        _open(browser, server + path, None)
        _wait(browser, lambda: _shown(browser, "token-form"), f"{path} asked for no token")
        time.sleep(1)  # any late answer would have been drawn by now
        assert not _shown(browser, "content")
        text = browser.find_element("tag name", "body").text
        assert "secret-demo" not in text and "dataset_convert" not in text, text
        rows = _js(browser, "return document.querySelectorAll('main tbody tr, article').length")
        assert rows == 0

    # A wrong token is refused and the form says why; the right one shows the data.
    browser.find_element("id", "token-input").send_keys("mko_wrong")
    browser.find_element("css selector", "#token-form button").click()
    _wait(
        browser,
        lambda: "unknown" in browser.find_element("id", "token-error").text,
        "a wrong token was not refused",
    )
    assert not _shown(browser, "content")
    browser.find_element("id", "token-input").send_keys(token)
    browser.find_element("css selector", "#token-form button").click()
    _wait(browser, lambda: _shown(browser, "content"), "the right token showed no data")
    _open(browser, server + "/ui/datasets", token)
    _wait(
        browser,
        lambda: "secret-demo" in browser.find_element("id", "datasets").text,
        "the datasets page did not list the dataset",
    )
    _open(browser, server + "/ui", token)
    _wait(
        browser,
        lambda: bool(
            _js(browser, f"return !!document.querySelector('tr[data-job-id=\"{job_id}\"]')")
        ),
        "the jobs page did not list the convert job",
    )
    _no_csp_violations(browser)


LIVE_SPEC_TOP = "logging_frequency: 1\n"


def test_job_page_curve_grows_while_the_job_runs(
    server: str,
    token: str,
    browser: Any,  # noqa: F811
    workers: Callable[..., Worker],
    demo_root: str,
) -> None:
    worker = workers("dash1")
    with _api(server, token) as api:
        dataset_id = register_demo(api, demo_root, worker)
        datasets_url = f"{server}/ui/datasets"
        _open(browser, datasets_url, token)
        _wait(
            browser,
            lambda: "circle" in browser.find_element("id", "datasets").text,
            "the datasets page showed no label map",
        )
        text = browser.find_element("id", "datasets").text
        assert "Conversion warnings" in text and "train" in text
        _screenshot(browser, "dashboard-datasets.png", 900)

        experiment_id = create_experiment(api, dataset_id, steps=30, every=15, top=LIVE_SPEC_TOP)
        submitted = api.post("/jobs", json={"action": "train", "experiment_id": experiment_id})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]

        _open(browser, f"{server}/ui/jobs/{job_id}", token)

        def points() -> int:
            return int(
                _js(browser, "return +document.getElementById('loss-chart').dataset.points || 0")
            )

        def status() -> str:
            return str(
                _js(browser, "return document.getElementById('job-fields').dataset.status || ''")
            )

        _wait(browser, lambda: points() >= 1, "no loss point drawn", timeout=240)
        first = points()
        assert status() == "running", status()
        _js(browser, "window.__sameDocument = true")
        _wait(browser, lambda: points() > first, "the loss curve did not grow", timeout=240)
        assert _js(browser, "return window.__sameDocument === true"), "the page reloaded"
        grown_while = status()
        fields = browser.find_element("id", "job-fields").text
        if grown_while == "running":  # the ETA of a running job, from its progress
            assert "ETA" in fields and "/ 30 steps" in fields, fields

        job = wait_for(api, job_id, {"succeeded", "failed"}, timeout=600, worker=worker)
        assert job["status"] == "succeeded", api.get(f"/jobs/{job_id}/logs").text
        assert grown_while == "running", grown_while
        metrics = api.get(f"/jobs/{job_id}/metrics").json()

    # Each metrics row holds the latest value of every metric: a loss is drawn where it
    # changed, an AP at the steps that evaluated (every 15 steps and the last).
    series = [m["values"]["Total loss"] for m in metrics if "Total loss" in m["values"]]
    losses = sum(1 for i, v in enumerate(series) if i == 0 or v != series[i - 1])
    assert losses >= 20
    _wait(browser, lambda: status() == "succeeded", "the page did not show the job succeeded")
    _wait(browser, lambda: points() == losses, f"the page did not draw all {losses} losses")
    _wait(
        browser,
        lambda: "succeeded" in browser.find_element("id", "log").text,
        "the log tail did not reach the end",
    )
    log = browser.find_element("id", "log").text
    assert "train started" in log and "Total loss" in log
    artifacts = browser.find_element("id", "artifacts").text
    assert "results/model.step-30.pth" in artifacts, artifacts
    has_ap = any("AP" in m["values"] for m in metrics)
    if has_ap:
        ap_steps = _js(
            browser,
            "return Chart.getChart('ap-chart').data.datasets"
            ".find(d => d.label === 'AP').data.map(p => p.x)",
        )
        assert ap_steps == [15, 30], ap_steps
    if any(k.startswith("AP/") for m in metrics for k in m["values"]):
        _wait(browser, lambda: _shown(browser, "per-class"), "no per-class AP table")
        assert "circle" in browser.find_element("id", "per-class-table").text
    _no_csp_violations(browser)
    _screenshot(browser, "dashboard-job.png", 1500)

    _open(browser, f"{server}/ui", token)

    def row() -> str:
        return str(
            _js(
                browser,
                "const r = document.querySelector(`tr[data-job-id='${arguments[0]}']`);"
                "return r ? r.textContent : ''",
                job_id,
            )
        )

    _wait(browser, lambda: "succeeded" in row(), "the jobs list did not show the job")
    assert "train" in row() and "30/30" in row(), row()
    _screenshot(browser, "dashboard-jobs.png", 600)


def _demo_coco_result(data_root: Path, demo_root: str) -> tuple[Path, list[dict[str, Any]]]:
    """A demo val image and its ground truth as a COCO result list (compressed RLE)."""
    from pycocotools import mask as mask_utils

    annotations = json.loads((data_root / demo_root / "annotations" / "val.json").read_text())
    image = annotations["images"][0]
    names = {c["id"]: c["name"] for c in annotations["categories"]}
    height, width = image["height"], image["width"]
    results = []
    for ann in annotations["annotations"]:
        if ann["image_id"] != image["id"]:
            continue
        segmentation = ann["segmentation"]
        if isinstance(segmentation, list):
            rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
        elif isinstance(segmentation["counts"], list):
            rle = mask_utils.frPyObjects(segmentation, height, width)
        else:
            rle = segmentation
        counts = rle["counts"]
        results.append(
            {
                "image_id": 0,
                "category_id": ann["category_id"],
                "category_name": names[ann["category_id"]],
                "bbox": ann["bbox"],
                "score": 0.9,
                "segmentation": {
                    "size": [height, width],
                    "counts": counts.decode() if isinstance(counts, bytes) else counts,
                },
            }
        )
    assert results
    return data_root / demo_root / "images" / "val" / image["file_name"], results


def test_try_an_image_draws_the_masks_of_a_coco_result(
    server: str,
    token: str,
    browser: Any,  # noqa: F811
    clean_db: Settings,
    demo_root: str,
) -> None:
    from pycocotools import mask as mask_utils

    engine = make_engine(clean_db)
    with make_session_factory(engine)() as session:
        export = Job(action="export", status="succeeded", queue=clean_db.cpu_queue)
        session.add(export)
        session.flush()
        session.add(PublishedModel(name="shapes", version=1, job_id=export.id))
        session.commit()
    engine.dispose()

    # The run-length decoding is exact, on a mask with runs longer than 31 pixels (several
    # characters per count) and negative deltas.
    rng = np.random.default_rng(0)
    mask = np.zeros((97, 131), np.uint8)
    mask[10:80, 20:120] = 1
    mask[rng.random(mask.shape) < 0.05] ^= 1
    rle = mask_utils.encode(np.asfortranarray(mask))
    fixed = {"size": [97, 131], "counts": rle["counts"].decode()}

    _open(browser, f"{server}/ui/models", token)
    _wait(browser, lambda: _shown(browser, "content"), "the models page showed nothing")
    _wait(
        browser,
        lambda: "shapes" in browser.find_element("id", "models").text,
        "the models page did not list the model",
    )
    decoded = _js(browser, "return Array.from(MaskOps.decodeRle(arguments[0]))", fixed)
    assert np.array_equal(np.array(decoded, np.uint8).reshape(97, 131), mask)

    image_path, results = _demo_coco_result(clean_db.data_root, demo_root)
    browser.find_element("id", "try-image").send_keys(str(image_path))
    browser.find_element("id", "try-threshold").clear()
    browser.find_element("id", "try-threshold").send_keys("0.5")
    # The real request first: the API takes the upload and says only Triton is missing.
    browser.find_element("css selector", "#try-form button").click()
    _wait(
        browser,
        lambda: "Triton" in browser.find_element("id", "try-status").text,
        "the real /infer request was not refused for want of Triton",
    )
    # Then /infer answers the fixed COCO result; the page must send the same request.
    _js(
        browser,
        """const results = arguments[0];
        const realFetch = window.fetch;
        window.__inferCalls = [];
        window.fetch = async (url, options) => {
          if (!String(url).includes('/infer?')) return realFetch(url, options);
          const image = options.body.get('images');
          window.__inferCalls.push({url: String(url), method: options.method,
            auth: options.headers.get('Authorization'), name: image.name, size: image.size});
          return new Response(JSON.stringify(results),
                              {status: 200, headers: {'Content-Type': 'application/json'}});
        };""",
        results,
    )
    browser.find_element("css selector", "#try-form button").click()
    _wait(
        browser,
        lambda: (
            _js(browser, "return document.getElementById('try-canvas').dataset.detections")
            == str(len(results))
        ),
        "the page drew no detections",
    )
    [call] = _js(browser, "return window.__inferCalls")
    assert call["method"] == "POST" and call["auth"] == f"Bearer {token}"
    assert "model=shapes" in call["url"] and "score_threshold=0.5" in call["url"]
    assert call["name"] == image_path.name and call["size"] == image_path.stat().st_size

    # Mask pixels are tinted, pixels outside every mask, box and label are the image's own
    # (drawn by the same function with no detection: same scale, same decoding).
    drawn = _canvas(browser, "try-canvas")
    scale = int(_js(browser, "return +document.getElementById('try-canvas').dataset.scale"))
    plain = _plain_drawing(browser, image_path.read_bytes())
    assert drawn.shape == plain.shape and scale >= 1
    union = np.zeros(drawn.shape[:2], bool)
    marks = np.zeros(drawn.shape[:2], bool)
    for result in results:
        instance = np.kron(mask_utils.decode(result["segmentation"]), np.ones((scale, scale)))
        instance = instance.astype(bool)
        union |= instance
        x, y, w, h = (round(v * scale) for v in result["bbox"])
        marks[max(0, y - 24) : y + h + 4, max(0, x - 4) : x + w + 160] = True
        changed = np.abs(drawn[instance].astype(int) - plain[instance].astype(int)).sum(axis=1)
        assert (changed > 0).mean() > 0.9, result["category_name"]
    outside = ~union & ~marks
    assert outside.sum() > 1000
    assert np.array_equal(drawn[outside], plain[outside])
    table = browser.find_element("id", "try-results").text
    for result in results:
        assert result["category_name"] in table
    _no_csp_violations(browser)
    _screenshot(browser, "dashboard-try-image.png", 1000)


def test_try_an_image_draws_what_a_model_published_through_triton_found(
    stack: Stack,  # noqa: F811
    browser: Any,  # noqa: F811
    workers: Callable[..., Worker],
    demo_root: str,
) -> None:
    """The whole way: the API as its image runs it (installed from the ``api`` extra, so the
    dashboard's files must be in the package), a real Triton, a model trained, exported and
    published by a real worker; the form's answer is drawn. (Loopback: no token needed.)"""
    from pycocotools import mask as mask_utils

    client = stack.client
    worker = workers("dash2", stack.settings)
    dataset_id = register_demo(client, demo_root, worker)
    experiment_id = create_experiment(client, dataset_id, steps=2, every=2)

    def run(body: dict[str, Any], path: str = "/jobs") -> dict[str, Any]:
        submitted = client.post(path, json=body)
        assert submitted.status_code == 202, submitted.text
        done = wait_for(client, submitted.json()["id"], {"succeeded", "failed"}, worker=worker)
        assert done["status"] == "succeeded", client.get(f"/jobs/{done['id']}/logs").text
        return done

    train = run({"action": "train", "experiment_id": experiment_id})
    export = run({"action": "export", "parent_job_id": train["id"]})
    # Named as `maskops export` names its default output: after the checkpoint exported.
    onnx_name = export_file_name(Path(train["result"]["checkpoint"]), DEFAULTS.data_type)
    assert export["result"]["onnx"] == f"jobs/{export['id']}/export/{onnx_name}"
    run({"job_id": export["id"]}, "/models/shapes/publish")

    image = sorted((stack.settings.data_root / demo_root / "images" / "val").glob("*.jpg"))[0]
    expected = client.post(
        "/infer",
        params={"model": "shapes", "score_threshold": 0},
        files=[("images", (image.name, image.read_bytes(), "image/jpeg"))],
    ).json()
    assert expected and all(r["segmentation"] for r in expected), expected

    base = str(client.base_url).rstrip("/")
    _open(browser, f"{base}/ui/models", None)
    _wait(
        browser,
        lambda: "shapes" in browser.find_element("id", "models").text,
        "the models page did not list the published model",
    )
    browser.find_element("id", "try-image").send_keys(str(image))
    browser.find_element("id", "try-threshold").clear()
    browser.find_element("id", "try-threshold").send_keys("0")
    browser.find_element("css selector", "#try-form button").click()
    _wait(
        browser,
        lambda: (
            _js(browser, "return document.getElementById('try-canvas').dataset.detections")
            == str(len(expected))
        ),
        f"the page did not draw the {len(expected)} detections /infer returns",
        timeout=120,
    )
    drawn = _canvas(browser, "try-canvas")
    scale = int(_js(browser, "return +document.getElementById('try-canvas').dataset.scale"))
    plain = _plain_drawing(browser, image.read_bytes())
    union = np.zeros(plain.shape[:2], bool)
    for result in expected:
        union |= np.kron(mask_utils.decode(result["segmentation"]), np.ones((scale, scale))) > 0
    assert union.any(), "the model's masks are all empty"
    tinted = np.abs(drawn[union].astype(int) - plain[union].astype(int)).sum(axis=1) > 0
    assert tinted.mean() > 0.9
    table = browser.find_element("id", "try-results").text
    assert all(str(r["category_name"] or r["category_id"]) in table for r in expected)


def _plain_drawing(driver: Any, jpeg: bytes) -> np.ndarray:
    """The image drawn by the page's own function with no detection (same scale, same
    decoding): what the canvas shows outside every mask, box and label."""
    _js(
        driver,
        """const c = document.createElement('canvas'); c.id = 'plain';
        const img = new Image(); img.onload = () => {
          MaskOps.drawDetections(c, img, []); c.dataset.ready = '1'; };
        img.src = 'data:image/jpeg;base64,' + arguments[0]; document.body.append(c);""",
        base64.b64encode(jpeg).decode(),
    )
    _wait(
        driver,
        lambda: _js(driver, "return document.getElementById('plain').dataset.ready") == "1",
        "the plain image was not drawn",
    )
    plain = _canvas(driver, "plain")
    _js(driver, "document.getElementById('plain').remove()")
    return plain


def _canvas(driver: Any, element_id: str) -> np.ndarray:
    width, height, pixels = _js(
        driver,
        """const c = document.getElementById(arguments[0]);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = '';
        for (let i = 0; i < d.length; i += 8192) {
          s += String.fromCharCode.apply(null, d.subarray(i, i + 8192));
        }
        return [c.width, c.height, btoa(s)];""",
        element_id,
    )
    return np.frombuffer(base64.b64decode(pixels), np.uint8).reshape(height, width, 4)[..., :3]
