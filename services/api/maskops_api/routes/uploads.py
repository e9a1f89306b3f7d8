"""Receiving a dataset archive: streamed once to disk under the size limit, then extracted
safely."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from maskops_api.errors import Invalid, TooLarge
from maskops_api.schemas import DataPath, DatasetCreate, Name
from maskops_api.services.uploads import TooLargeArchive, UnsafeArchive, extract_archive
from maskops_api.streamed_form import read_form
from maskops_core.dataset_formats import DatasetFormat
from maskops_core.leftovers import UPLOAD_SPOOL_PREFIX, UPLOAD_SPOOL_SUFFIX
from maskops_core.paths import relative_data_path
from maskops_core.settings import Settings

ARCHIVE_FIELD = "archive"
ARCHIVE_MEDIA_TYPES = (
    "application/zip",
    "application/x-tar",
    "application/gzip",
    "application/x-bzip2",
    "application/x-xz",
)
"""What the archive part may be (told by its bytes, not by its part's Content-Type)."""


class UploadForm(BaseModel):
    """A dataset archive, and where its splits' images and COCO JSON are inside it."""

    # Lax types, unlike JSON bodies: every form value arrives as text ("8" is a number).
    # Unknown fields are refused, as in JSON bodies: a misspelt one would be dropped.
    model_config = ConfigDict(extra="forbid")

    name: Name
    train_image_dir: DataPath = "images/train"
    train_annotation_file: DataPath = "annotations/train.json"
    val_image_dir: DataPath | None = "images/val"
    val_annotation_file: DataPath | None = "annotations/val.json"
    num_shards: Annotated[int, Field(ge=1, le=1024)] = 8
    format: DatasetFormat = Field(
        default="coco", description="How the annotations are written (see POST /datasets)."
    )
    labels: str | None = Field(
        default=None,
        max_length=100_000,
        description="Category names in id order, comma-separated (id 1 first).",
    )

    @field_validator(
        "train_image_dir", "train_annotation_file", "val_image_dir", "val_annotation_file"
    )
    @classmethod
    def _inside_archive(cls, value: str | None) -> str | None:
        # As DataPath's pattern says: "/x" was otherwise read as "uploads/<id>/x" (a 404
        # naming a path the client never gave), and ".." refused as "train.image_dir".
        if value is not None:
            try:
                relative_data_path(value)
            except ValueError:
                raise ValueError("must be a path inside the archive, without '..'") from None
        return value


def request_body() -> dict[str, Any]:
    """The route's OpenAPI request body: :class:`UploadForm` plus the archive."""
    schema = UploadForm.model_json_schema()
    archive = {
        "type": "string",
        "contentMediaType": "application/octet-stream",
        "description": "zip or tar(.gz, .bz2, .xz) of images + COCO JSON",
    }
    schema["properties"] = {ARCHIVE_FIELD: archive, **schema["properties"]}
    schema["required"] = [ARCHIVE_FIELD, *schema.get("required", [])]
    encoding = {ARCHIVE_FIELD: {"contentType": ", ".join(ARCHIVE_MEDIA_TYPES)}}
    return {
        "required": True,
        "content": {"multipart/form-data": {"schema": schema, "encoding": encoding}},
    }


async def receive(request: Request, settings: Settings) -> tuple[Path, UploadForm]:
    """Stream the archive to a file under ``uploads/`` (once, limits applied as it arrives)
    and extract it to ``uploads/<uuid>``."""
    uploads = settings.data_root / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        dir=uploads, prefix=UPLOAD_SPOOL_PREFIX, suffix=UPLOAD_SPOOL_SUFFIX
    ) as spool:
        form = await read_form(
            request, spool, file_field=ARCHIVE_FIELD, max_file_bytes=settings.max_upload_bytes
        )
        fields = _validated(form.fields, has_archive=form.filename is not None)
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
            raise TooLarge(f"archive {form.filename!r}: {exc}") from None
        except UnsafeArchive as exc:
            raise Invalid(f"archive {form.filename!r}: {exc}") from None
    return folder, fields


def _validated(fields: dict[str, str], *, has_archive: bool) -> UploadForm:
    """The form's fields as FastAPI validates ``Form`` parameters: an empty value is an
    absent one; errors are the same 422 with each field named."""
    errors: list[dict[str, Any]] = []
    if not has_archive:
        # Sent as text (no file name, curl -F archive=d.zip without the @), or not at all.
        msg = "a file is expected, not text" if ARCHIVE_FIELD in fields else "Field required"
        errors.append({"type": "missing", "loc": ("body", ARCHIVE_FIELD), "msg": msg})
    given = {k: v for k, v in fields.items() if v != "" and k != ARCHIVE_FIELD}
    try:
        form = UploadForm.model_validate(given)
    except ValidationError as exc:
        errors += [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
    if errors:
        raise RequestValidationError(errors)
    return form


def dataset_body(
    settings: Settings,
    folder: Path,
    *,
    name: str,
    train: tuple[str, str],
    val: tuple[str | None, str | None],
    num_shards: int,
    format_name: str = "coco",
    labels: str | None = None,
) -> DatasetCreate:
    base = folder.relative_to(settings.data_root).as_posix()
    splits: dict[str, object] = {
        "train": {"image_dir": f"{base}/{train[0]}", "annotation_file": f"{base}/{train[1]}"}
    }
    val_dir, val_json = val
    if val_dir and val_json and (folder / val_json).exists():
        splits["val"] = {"image_dir": f"{base}/{val_dir}", "annotation_file": f"{base}/{val_json}"}
    source: dict[str, object] = {"format": format_name}
    if labels:
        source["labels"] = [n.strip() for n in labels.split(",") if n.strip()]
    try:
        return DatasetCreate.model_validate(
            {"name": name, "num_shards": num_shards, **source, **splits}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Invalid(f"{where}: {first['msg']}") from None
