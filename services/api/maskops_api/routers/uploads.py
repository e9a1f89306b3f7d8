"""Receiving a dataset archive: size-limited streaming to disk, then safe extraction."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from fastapi import UploadFile
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from maskops_api.errors import Invalid, TooLarge
from maskops_api.schemas import DatasetCreate
from maskops_api.services.uploads import TooLargeArchive, UnsafeArchive, extract_archive
from maskops_core.settings import Settings


async def receive(archive: UploadFile, settings: Settings) -> Path:
    """Write the upload to a temporary file and extract it to ``uploads/<uuid>``."""
    uploads = settings.data_root / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=uploads, suffix=".part") as spool:
        size = 0
        while chunk := await archive.read(1024 * 1024):
            size += len(chunk)
            if size > settings.max_upload_bytes:
                raise TooLarge(f"upload larger than {settings.max_upload_bytes} bytes")
            spool.write(chunk)
        spool.flush()
        folder = uploads / uuid.uuid4().hex
        try:
            await run_in_threadpool(
                extract_archive,
                Path(spool.name),
                folder,
                max_bytes=settings.max_extracted_bytes,
                max_ratio=settings.max_archive_ratio,
            )
        except TooLargeArchive as exc:
            raise TooLarge(f"archive {archive.filename!r}: {exc}") from None
        except UnsafeArchive as exc:
            raise Invalid(f"archive {archive.filename!r}: {exc}") from None
    return folder


def dataset_body(
    settings: Settings,
    folder: Path,
    *,
    name: str,
    train: tuple[str, str],
    val: tuple[str | None, str | None],
    num_shards: int,
) -> DatasetCreate:
    base = folder.relative_to(settings.data_root).as_posix()
    splits: dict[str, object] = {
        "train": {"image_dir": f"{base}/{train[0]}", "annotation_file": f"{base}/{train[1]}"}
    }
    val_dir, val_json = val
    if val_dir and val_json and (folder / val_json).is_file():
        splits["val"] = {"image_dir": f"{base}/{val_dir}", "annotation_file": f"{base}/{val_json}"}
    try:
        return DatasetCreate.model_validate({"name": name, "num_shards": num_shards, **splits})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Invalid(f"{where}: {first['msg']}") from None
