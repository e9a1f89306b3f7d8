"""``POST /infer``: images in (multipart), COCO results out, through Triton."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Query, UploadFile
from fastapi.concurrency import run_in_threadpool

from maskops_api.deps import ReadAccess, SettingsDep
from maskops_api.errors import ERROR_RESPONSES, ApiError, Invalid, NotFound, TooLarge
from maskops_api.schemas import MODEL_NAME_PATTERN, CocoResult

router = APIRouter(tags=["infer"], responses=ERROR_RESPONSES)


class Unavailable(ApiError):
    status_code = 503


class BadGateway(ApiError):
    status_code = 502


@router.post(
    "/infer",
    response_model=list[CocoResult],
    dependencies=[ReadAccess],
    responses={413: ERROR_RESPONSES[422] | {"description": "Too many or too large images"}},
)
async def infer(
    settings: SettingsDep,
    images: Annotated[list[UploadFile], File(description="JPEG or PNG images")],
    model: Annotated[str, Query(pattern=MODEL_NAME_PATTERN)],
    version: Annotated[str, Query(pattern=r"^[0-9]{0,9}$")] = "",
    score_threshold: Annotated[float, Query(ge=0.0, le=1.0)] = 0.0,
) -> list[CocoResult]:
    """Run the published model ``model`` on each image; ``image_id`` is the image's position."""
    if not settings.triton_url:
        raise Unavailable("no Triton server is configured (MASKOPS_TRITON_URL)")
    if len(images) > settings.max_infer_images:
        raise TooLarge(f"at most {settings.max_infer_images} images per request")
    payloads: list[bytes] = []
    for index, upload in enumerate(images):
        data = await upload.read(settings.max_infer_image_bytes + 1)
        if len(data) > settings.max_infer_image_bytes:
            raise TooLarge(f"image {index} ({upload.filename}) is larger than the limit")
        payloads.append(data)
    from maskops.serving.client import (
        InvalidImage,
        ModelNotFound,
        TritonError,
        TritonUnavailable,
        infer_images,
    )

    try:
        per_image = await run_in_threadpool(
            infer_images,
            settings.triton_url,
            model,
            payloads,
            score_threshold=score_threshold,
            version=version,
        )
    except InvalidImage as exc:
        raise Invalid(str(exc)) from None
    except ModelNotFound as exc:
        raise NotFound(str(exc)) from None
    except TritonUnavailable as exc:
        raise Unavailable(str(exc)) from None
    except TritonError as exc:
        raise BadGateway(str(exc)) from None
    return [CocoResult.model_validate(d) for results in per_image for d in results]
