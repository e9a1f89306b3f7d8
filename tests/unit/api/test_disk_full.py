"""A full disk is the server's problem, said as such: an upload that runs out of space
while it arrives or while it is extracted is a 507 naming the data root's disk (never a
500, nor a 422 "corrupt archive"), leaves nothing behind, and ``/readyz`` reports the disk
while it is short of space.

The data root is a real 2 MiB tmpfs (tests/support/tmpfs.py), so every ``ENOSPC`` is the
kernel's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.support.tmpfs import run_on_tmpfs

CHILD = r"""
import io, json, os, sys, zipfile
from pathlib import Path
from fastapi.testclient import TestClient
from maskops_api.main import create_app
from maskops_core.db.migrate import upgrade_head
from maskops_core.settings import Settings
from tests.unit.api.conftest import ARCHIVE_LAYOUT, RecordingDispatcher

data_root, work = Path(sys.argv[1]), Path(sys.argv[2])
settings = Settings(
    database_url=f"sqlite:///{work / 'maskops.db'}", broker_url="memory://",
    data_root=data_root, min_free_disk_bytes=1024**2, _env_file=None,
)
upgrade_head(settings)

def archive(noise: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for name, data in ARCHIVE_LAYOUT.items():
            z.writestr(name, data)
        z.writestr("noise.bin", os.urandom(noise))
    return buffer.getvalue()

out = {}
with TestClient(base_url="http://localhost",
                app=create_app(settings, dispatcher=RecordingDispatcher())) as client:
    out["ready"] = client.get("/readyz").status_code
    for name, noise in (("spool", 3 * 1024**2), ("extract", 1200 * 1024)):
        r = client.post("/datasets/upload", data={"name": name},
                        files={"archive": ("d.zip", archive(noise))})
        out[name] = [r.status_code, r.json().get("detail", "")]
    out["left"] = sorted(p.name for p in (data_root / "uploads").iterdir())
    (data_root / "filler").write_bytes(b"\0" * (1536 * 1024))
    r = client.get("/readyz")
    out["short"] = [r.status_code, r.json()["checks"].get("disk", "")]
    (data_root / "filler").unlink()
    out["again"] = client.get("/readyz").status_code
print(json.dumps(out))
"""


def test_a_full_disk_is_507_and_readyz_says_so(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "child.py").write_text(CHILD)
    command = f"{sys.executable} {tmp_path / 'child.py'} {root} {tmp_path}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = run_on_tmpfs(root, "2m", command, env=env, cwd=Path(__file__).parents[3], timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ready"] == 200
    for name in ("spool", "extract"):
        code, detail = out[name]
        assert code == 507, (name, detail)
        assert "no space left on the data root's disk (MASKOPS_DATA_ROOT" in detail
    assert out["left"] == []
    code, disk = out["short"]
    assert code == 503 and "the data root's disk (MASKOPS_DATA_ROOT) has 0 MiB free" in disk
    assert out["again"] == 200
