"""``POST /infer``: images in (multipart), COCO results out, through the Triton replicas."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from maskops.serving.protocol import ImageLimits
from maskops_api.deps import FactoryDep, ReadAccess, SettingsDep
from maskops_api.errors import ERROR_RESPONSES, ApiError, Invalid, NotFound, TooLarge
from maskops_api.images import ImageError, UnsupportedFormat, read_header
from maskops_api.infer_lane import infer_lane
from maskops_api.schemas import MODEL_NAME_PATTERN, CocoResult
from maskops_api.serving.replicas import replica_pool
from maskops_core.db.models import PublishedModel
from maskops_core.settings import Settings

router = APIRouter(tags=["infer"], responses=ERROR_RESPONSES)


class Unavailable(ApiError):
    status_code = 503


class BadGateway(ApiError):
    status_code = 502


class UnsupportedMedia(ApiError):
    status_code = 415


IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png")
"""What each image part may be (told by its bytes, not by its part's Content-Type)."""
RETRY_AFTER_S = 5
"""What a 503 for a published model Triton has not loaded yet, or for a Triton that is
away, tells clients to wait (a refusal by the replicas' circuits says when they probe)."""
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


@router.post(
    "/infer",
    response_model=list[CocoResult],
    dependencies=[ReadAccess],
    responses={
        413: ERROR_RESPONSES[422] | {"description": "Too many or too large images"},
        415: ERROR_RESPONSES[422] | {"description": "An image is not a JPEG or PNG"},
        429: ERROR_RESPONSES[422]
        | {
            "description": "MASKOPS_MAX_CONCURRENT_INFER requests are waiting on Triton "
            "(with Retry-After)"
        },
        502: ERROR_RESPONSES[422] | {"description": "Triton failed to run the model"},
        503: ERROR_RESPONSES[503],
    },
    # Each part of ``images`` is a JPEG or PNG: encoding is how OpenAPI says so.
    openapi_extra={
        "requestBody": {
            "content": {
                "multipart/form-data": {
                    "encoding": {"images": {"contentType": ", ".join(IMAGE_MEDIA_TYPES)}}
                }
            }
        }
    },
)
async def infer(
    request: Request,
    settings: SettingsDep,
    factory: FactoryDep,
    images: Annotated[
        list[UploadFile],
        File(
            description="JPEG or PNG images: at most MASKOPS_MAX_INFER_IMAGES per request, "
            "each at most MASKOPS_MAX_INFER_IMAGE_BYTES, MASKOPS_MAX_INFER_IMAGE_PIXELS and "
            "MASKOPS_MAX_INFER_IMAGE_SIDE (413 beyond) and MASKOPS_MAX_INFER_IMAGE_ASPECT "
            "(422 beyond)",
            min_length=1,
        ),
    ],
    model: Annotated[str, Query(pattern=MODEL_NAME_PATTERN)],
    version: Annotated[str, Query(pattern=r"^[0-9]{0,9}$")] = "",
    score_threshold: Annotated[float, Query(ge=0.0, le=1.0)] = 0.0,
    mask_format: Annotated[
        Literal["rle", "polygon"],
        Query(description="Masks as COCO RLE (default) or as COCO polygons (their outlines)."),
    ] = "rle",
    polygon_tolerance: Annotated[
        float,
        Query(
            ge=0.0,
            le=50.0,
            description="With mask_format=polygon: Douglas-Peucker tolerance in pixels (at "
            "most 2% of the square root of an object's area).",
        ),
    ] = 1.0,
) -> list[CocoResult]:
    """Run the published model ``model`` on each image; ``image_id`` is the image's position."""
    # Client errors first, from the request alone: then whether the model exists; only
    # then Triton, which is asked about nothing the API could have answered itself.
    payloads = await _checked_payloads(images, settings)
    if not await run_in_threadpool(_is_published, factory, model, version):
        which = f"version {version} of " if version else ""
        raise NotFound(f"{which}model {model!r} is not published")
    if not settings.has_triton:
        raise Unavailable("no Triton is configured (MASKOPS_TRITON_URL, MASKOPS_TRITON_DNS)")
    timeout_s = settings.infer_timeout_s * len(payloads)
    per_image = await _run_on_triton(request, model, version, payloads, score_threshold, timeout_s)
    detections = [d for results in per_image for d in results]
    if mask_format == "polygon":
        detections = await run_in_threadpool(as_polygons, detections, polygon_tolerance)
    return [CocoResult.model_validate(d) for d in detections]


async def _checked_payloads(images: list[UploadFile], settings: Settings) -> list[bytes]:
    """The images' bytes, each within the limits (413, 415 or 422 naming the image)."""
    if len(images) > settings.max_infer_images:
        raise TooLarge(f"at most {settings.max_infer_images} images per request")
    payloads: list[bytes] = []
    for index, upload in enumerate(images):
        data = await upload.read(settings.max_infer_image_bytes + 1)
        if len(data) > settings.max_infer_image_bytes:
            raise TooLarge(f"image {index} ({upload.filename}) is larger than the limit")
        _check_image(index, data, settings)
        payloads.append(data)
    return payloads


async def _run_on_triton(
    request: Request,
    model: str,
    version: str,
    payloads: list[bytes],
    score_threshold: float,
    timeout_s: float,
) -> list[list[dict[str, Any]]]:
    """Each image's COCO results from a Triton replica within ``timeout_s``, Triton's
    errors as API errors; 429 when ``/infer``'s lane is full (:mod:`maskops_api.infer_lane`)."""
    from maskops.serving.circuit import ReplicasDown
    from maskops.serving.client import InvalidImage, ModelNotFound, TritonError, TritonUnavailable

    pool = replica_pool(request.app.state)
    try:
        # Every replica's circuit open: refused here, without taking a slot or a thread.
        refusal = pool.refusal()
        if refusal is not None:
            raise refusal
        # Round-robin over the replicas; one whose circuit is open is skipped.
        per_image: list[list[dict[str, Any]]] = await infer_lane(request.app.state).run(
            pool.infer,
            model,
            payloads,
            score_threshold=score_threshold,
            version=version,
            timeout_s=timeout_s,
        )
    except InvalidImage as exc:
        raise Invalid(_readable(exc)) from None
    except ModelNotFound as exc:
        # Published (checked above) yet not loaded: Triton is starting or reloading its
        # repository (about 3 s after a restart). Temporary, so 503, not 404.
        raise Unavailable(
            f"model {model!r} is published but not loaded in Triton yet; retry shortly "
            f"({_readable(exc)})",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    except TritonUnavailable as exc:
        # Under ``maskops serve`` the supervisor knows why ("Triton is starting", "Triton
        # exited with code -9, restarting in 2 s").
        supervisor = getattr(request.app.state, "supervisor", None)
        triton = None if supervisor is None else supervisor.triton
        wait = exc.retry_after_s if isinstance(exc, ReplicasDown) else RETRY_AFTER_S
        raise Unavailable(
            (triton and triton.problem) or _readable(exc),
            headers={"Retry-After": str(math.ceil(wait))},
        ) from None
    except TritonError as exc:
        raise BadGateway(_readable(exc)) from None
    return per_image


def as_polygons(detections: list[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """The detections with their RLE masks as polygons (an empty list for a mask with no
    outline of 3 points or more)."""
    from maskops.masks import rle_to_polygons

    return [
        d | {"segmentation": rle_to_polygons(d["segmentation"], tolerance)}
        if isinstance(d.get("segmentation"), dict)
        else d
        for d in detections
    ]


def _check_image(index: int, data: bytes, settings: Settings) -> None:
    """JPEG or PNG (415), no more pixels nor a longer side than the limits (413), no
    narrower than the aspect limit (422), from the header only: decoding a huge image is
    what the limits guard against. The whole image is given: a JPEG's frame header may
    follow any amount of metadata (ICC profiles of several 64 KiB segments)."""
    try:
        header = read_header(data)
    except UnsupportedFormat as exc:
        raise UnsupportedMedia(f"image {index}: {exc}") from None
    except ImageError as exc:
        raise Invalid(f"image {index}: {exc}") from None
    refusal = ImageLimits(**settings.infer_image_limits).refusal(header.width, header.height)
    if refusal is not None:
        limit, why = refusal
        raise (Invalid if limit == "aspect" else TooLarge)(f"image {index}: {why}")


def _is_published(factory: sessionmaker[Session], name: str, version: str) -> bool:
    """Whether ``name`` (at ``version``, when given) is a model users may call: the parts
    of a published ensemble (``<name>_net``...) are not."""
    query = select(PublishedModel.id).where(
        PublishedModel.name == name, PublishedModel.published.is_(True)
    )
    if version:
        query = query.where(PublishedModel.version == int(version))
    with factory() as session:
        return session.scalar(query.limit(1)) is not None


def _readable(exc: Exception) -> str:
    # Messages from image libraries name Python objects ("<_io.BytesIO object at 0x7f...>").
    return _OBJECT_REPR.sub("the image", str(exc))
