"""What a spec's ``checkpoint`` may name besides a local file: published weights.

- a torchvision weights enum member by name, ``MaskRCNN_ResNet50_FPN_Weights.COCO_V1`` or
  ``ResNet50_Weights.IMAGENET1K_V2`` (torchvision knows its URL, whose file name carries
  the first hex digits of its SHA-256);
- a URL with the file's whole SHA-256 after it: ``https://host/path/file.pth#sha256=<64 hex>``.

Either is fetched into the weights cache (:mod:`maskops.checkpoints.hub`); neither is a
path, so neither is resolved against the spec's directory. Standard library only: the
control plane's spec checks use it.
"""

from __future__ import annotations

import re

WEIGHTS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*_Weights\.[A-Z][A-Z0-9_]*$")
"""Enum members are upper case, so a file such as ``my_Weights.pth`` is not a name."""
WEIGHTS_URL = re.compile(r"^(https?://[^#\s]+)#sha256=([0-9a-f]{64})$")
URL_PREFIXES = ("http://", "https://")


def is_weights_name(value: str) -> bool:
    """``ResNet50_Weights.IMAGENET1K_V2``-shaped (torchvision may still not know it)."""
    return WEIGHTS_NAME.fullmatch(value) is not None


def is_url(value: str) -> bool:
    return value.startswith(URL_PREFIXES)


def is_weights_reference(value: str) -> bool:
    """A weights name or a URL: fetched, not a path."""
    return is_weights_name(value) or is_url(value)


def split_weights_url(value: str) -> tuple[str, str]:
    """``(url, sha256)`` of ``URL#sha256=HEX``; ValueError naming the form otherwise."""
    match = WEIGHTS_URL.fullmatch(value)
    if match is None:
        raise ValueError(
            f"{value!r}: a weights URL needs the file's SHA-256 after it: "
            "URL#sha256=<64 lowercase hex digits> (sha256sum prints it)"
        )
    return match.group(1), match.group(2)
