"""Reading user images for inference and serving: any mode, EXIF orientation applied."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from maskops.evaluation.errors import ImageReadError
from maskops.serving.triton_models.maskops_serving_ops import IMAGE_FORMATS, to_rgb

IMAGE_SUFFIXES: frozenset[str] = frozenset({".jpg", ".jpeg", ".png"})


def load_rgb(source: str | Path | bytes | BinaryIO, *, name: str | None = None) -> Image.Image:
    """Decode a JPEG/PNG into an upright RGB PIL image.

    EXIF orientation is applied (phone photos are stored sideways with a rotation tag);
    palette, grey, 16-bit, CMYK and alpha images become 8-bit RGB (alpha is dropped, not
    composited: detection looks at the stored colours).

    Args:
        source: a path, encoded bytes, or a binary file object.
        name: how to refer to the image in errors (defaults to the path).

    Raises:
        ImageReadError: unreadable, truncated, or not a JPEG/PNG.
    """
    label = name or (str(source) if isinstance(source, (str, Path)) else "<image>")
    stream: str | Path | BinaryIO = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with warnings.catch_warnings():
            # Large photos are fine (PIL still refuses real decompression bombs, > 179 MP).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(stream) as image:
                if image.format not in IMAGE_FORMATS:
                    raise ImageReadError(
                        f"{label}: {image.format} images are not supported (JPEG or PNG expected)"
                    )
                image.load()
                upright = ImageOps.exif_transpose(image)
                return to_rgb(upright)
    except ImageReadError:
        raise
    except FileNotFoundError:
        raise ImageReadError(f"{label}: file not found") from None
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
    ) as exc:
        raise ImageReadError(f"{label}: unreadable image ({exc})") from None


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as a ``[3, H, W]`` uint8 tensor."""
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def read_image(source: str | Path | bytes | BinaryIO, *, name: str | None = None) -> torch.Tensor:
    """Decode a JPEG/PNG (EXIF orientation applied) as a ``[3, H, W]`` uint8 RGB tensor.

    Raises:
        ImageReadError: see :func:`load_rgb`.
    """
    return pil_to_tensor(load_rgb(source, name=name))


def list_images(directory: Path) -> tuple[list[Path], list[Path]]:
    """The JPEG/PNG files of a directory (sorted by name) and the other files in it.

    Hidden files and subdirectories are ignored; the suffix test is case-insensitive.
    """
    images: list[Path] = []
    others: list[Path] = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        (images if path.suffix.lower() in IMAGE_SUFFIXES else others).append(path)
    return images, others
