"""Partial files of killed writers are swept when ``maskops serve`` starts: an upload's
spooled archive (``uploads/tmp*.part``) and an import's unrenamed shard (``.*.tmp``), each
left by a real process killed with SIGKILL mid-write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from maskops_core import leftovers
from maskops_serve import embedded

KILLED_UPLOAD = """
import os, signal, sys, tempfile
spool = tempfile.NamedTemporaryFile(dir=sys.argv[1], prefix=sys.argv[2], suffix=sys.argv[3])
spool.write(b"PK" * 1000); spool.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""
KILLED_IMPORT = """
import os, signal, sys
from pathlib import Path
from maskops.data.shards import ShardWriter
writer = ShardWriter(Path(sys.argv[1]) / "train-00000.tar")
writer.write("0", {"id": 0}, b"\\x89PNG", "png")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(script: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-c", script, *args], check=False, timeout=120)
    assert done.returncode == -9


def _leave_partial_files(data_root: Path) -> tuple[Path, Path]:
    uploads, shards = data_root / "uploads", data_root / "datasets" / "1" / "shards"
    uploads.mkdir(parents=True, exist_ok=True)
    shards.mkdir(parents=True, exist_ok=True)
    _killed(
        KILLED_UPLOAD, str(uploads), leftovers.UPLOAD_SPOOL_PREFIX, leftovers.UPLOAD_SPOOL_SUFFIX
    )
    _killed(KILLED_IMPORT, str(shards))
    (shards / "train-00001.tar").write_bytes(b"a finished shard stays")
    return uploads, shards


def test_serve_sweeps_what_killed_uploads_and_imports_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "ensure_demo_dataset", lambda settings: settings.data_root)
    config = embedded.EmbeddedConfig(state_dir=tmp_path / "state", use_redis=False)
    settings = embedded.embedded_settings(config)
    uploads, shards = _leave_partial_files(settings.data_root)
    assert len(list(uploads.glob("tmp*.part"))) == 1
    assert len(list(shards.glob(".*.tmp"))) == 1
    said: list[str] = []
    embedded._prepare_state(config, said.append)
    assert list(uploads.iterdir()) == []
    assert [p.name for p in shards.iterdir()] == ["train-00001.tar"]
    assert "data:     removed 2 partial files left by killed uploads or writes" in said
