"""``maskops serve --demo``, the README's first command, walked whole: the embedded stack
with the real Triton, every step of the walk over HTTP, and the picture it draws. A short
training (``--demo-steps``) keeps it CI-sized; the recipe's accuracy is
tests/unit/training/test_recipe_slow.py's."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from maskops_serve.demo import DEMO_PICTURE, PICTURE_SIDE

pytestmark = pytest.mark.integration

MASKOPS = Path(sys.executable).with_name("maskops")
WALK_STEPS = 16
WALK_S = 900
"""The walk's deadline on a busy 2-core CI machine (about 3 minutes alone)."""

STEPS_PRINTED = (
    "1. dataset_convert",
    "2. experiment from a TAO text spec",
    f"3. train ({WALK_STEPS} steps)",
    "4. evaluate",
    "5. prune",
    "6. export",
    "7. publish",
    "   model demo version 1 published",
    "8. infer",
    "   masks drawn on the image:",
    "demo finished; the stack keeps running",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _walk_output(process: subprocess.Popen[bytes], out: Path) -> str:
    """The server's output once the walk ends (or fails, or the server exits)."""
    deadline = time.monotonic() + WALK_S
    while time.monotonic() < deadline:
        text = out.read_text()
        if "demo finished" in text or "demo: failed" in text or process.poll() is not None:
            return text
        time.sleep(2)
    raise AssertionError(f"the walk did not end within {WALK_S} s:\n{out.read_text()[-4000:]}")


def test_the_walk_runs_every_step_and_draws_its_picture(tmp_path: Path) -> None:
    state = tmp_path / "state"
    out = tmp_path / "serve.out"
    with out.open("wb") as handle:
        process = subprocess.Popen(
            [str(MASKOPS), "serve", "--demo", "--demo-steps", str(WALK_STEPS), "--no-redis",
             "--port", str(_free_port()), "--state-dir", str(state)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        text = _walk_output(process, out)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(90)
    assert "demo: failed" not in text, text
    missing = [line for line in STEPS_PRINTED if line not in text]
    assert not missing, f"not printed: {missing}\n{text}"
    assert re.search(r"\n   \S+\.jpg: \d+ detections?: \w+ \d\.\d\d", text), text
    assert code == 0, text
    with Image.open(state / DEMO_PICTURE) as picture:
        assert picture.format == "PNG" and max(picture.size) == PICTURE_SIDE
