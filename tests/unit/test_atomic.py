"""maskops.atomic: a replaced file is the old one or the whole new one, whatever happens."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maskops.atomic import atomic_path, atomic_write, commit, temporary_sibling

REPO = Path(__file__).resolve().parents[2]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("durable", [False, True])
def test_atomic_write_replaces_the_content(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "status.json"
    target.write_text("old")
    assert atomic_write(target, '{"new": 1}', durable=durable) == target
    assert target.read_text() == '{"new": 1}'
    atomic_write(target, b"\x00bytes", durable=durable)
    assert target.read_bytes() == b"\x00bytes"
    assert _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old model")
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half a new mo")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old model"
    assert _leftovers(tmp_path) == []


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path: Path) -> None:
    """A process killed (SIGKILL: no cleanup runs) while writing: the target is untouched."""
    target = tmp_path / "model.pth"
    target.write_bytes(b"old checkpoint")
    writer = (
        "import sys, time\n"
        "from maskops.atomic import atomic_path\n"
        "with atomic_path(sys.argv[1], durable=True) as tmp:\n"
        "    with open(tmp, 'wb') as fh:\n"
        "        while True:\n"
        "            fh.write(b'x' * 4096); fh.flush(); time.sleep(0.01)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", writer, str(target)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 8192 for p in tmp_path.glob(".model.pth.*.tmp")):
            assert child.poll() is None and time.monotonic() < deadline, "writer never wrote"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert target.read_bytes() == b"old checkpoint"
    # What the killed writer leaves is hidden and never taken for the target.
    assert [p.name.startswith(".model.pth.") for p in tmp_path.glob("*.tmp")] == [True]


def test_mode_is_set_at_creation(tmp_path: Path) -> None:
    secret = tmp_path / "admin-token"
    secret.write_text("old")
    secret.chmod(0o644)
    atomic_write(secret, "s3cret\n", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == "s3cret\n"


def test_temporary_names_are_hidden_unique_siblings(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.json"
    first, second = temporary_sibling(target), temporary_sibling(target)
    assert first != second
    assert first.parent == second.parent == target.parent
    assert first.name.startswith(".a.json.") and first.name.endswith(".tmp")


def test_commit_renames_a_file_written_in_place(tmp_path: Path) -> None:
    target = tmp_path / "train-00000-of-00001.tar"
    tmp = temporary_sibling(target)
    with tmp.open("wb") as stream:
        stream.write(b"tar bytes")
    commit(tmp, target, durable=True)
    assert target.read_bytes() == b"tar bytes" and not tmp.exists()
